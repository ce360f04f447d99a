"""``simpler_setup.elf_parser`` on pto: the ``.text`` section of an ELF64 object (only drivers
for the device call it; on pto's simulator platforms kernels are shared libraries)."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Union


def extract_text_section(obj: Union[bytes, str, Path]) -> bytes:
    data = obj if isinstance(obj, (bytes, bytearray)) else Path(obj).read_bytes()
    data = bytes(data)
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError("extract_text_section: not an ELF64 object")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    def section(i: int):  # type: ignore[no-untyped-def]
        return struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
    names = section(shstrndx)
    for i in range(shnum):
        s = section(i)
        start = names[4] + s[0]
        name = data[start : data.index(b"\0", start)]
        if name == b".text":
            return data[s[4] : s[4] + s[5]]
    raise ValueError("extract_text_section: no .text section")

// A "kernel" library that forgot kernel_entry.
extern "C" int not_a_kernel(void) { return 1; }

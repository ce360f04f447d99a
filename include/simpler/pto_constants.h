/* pto's simpler-compatible headers: constants shared by kernel-side structures. */
#ifndef PTO_SIMPLER_CONSTANTS_H
#define PTO_SIMPLER_CONSTANTS_H

#define PTO2_ALIGN_SIZE 64

#endif /* PTO_SIMPLER_CONSTANTS_H */

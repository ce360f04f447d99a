/* pto's simpler-compatible headers: argument containers (see pto_types.h). */
#ifndef PTO_SIMPLER_TASK_ARGS_H
#define PTO_SIMPLER_TASK_ARGS_H
#include "pto_types.h"
#endif

/* pto's simpler-compatible headers: the runtime binding (see pto_orchestration_api.h). */
#ifndef PTO_SIMPLER_COMMON_H
#define PTO_SIMPLER_COMMON_H
#include "pto_orchestration_api.h"
#endif

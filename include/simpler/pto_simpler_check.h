/* pto's simpler-compatible headers: the check that guards descriptor invariants.
 *
 * A broken invariant (a view outside its buffer, a reshape of a strided tensor) is a bug in the
 * calling program: it is reported on stderr with the file and line and the process aborts, so
 * that pto names the chip that died and its signal. */
#ifndef PTO_SIMPLER_CHECK_H
#define PTO_SIMPLER_CHECK_H

#include <cstdio>
#include <cstdlib>

[[noreturn]] inline void pto_simpler_check_failed(const char *what, const char *file, int line) {
    std::fprintf(stderr, "pto simpler: check failed: %s (%s:%d)\n", what, file, line);
    std::fflush(stderr);
    std::abort();
}

#define PTO_SIMPLER_CHECK(cond) \
    ((cond) ? (void)0 : pto_simpler_check_failed(#cond, __FILE__, __LINE__))

/* The names simpler's sources use for the same two kinds of check. */
#ifndef always_assert
#define always_assert(cond) PTO_SIMPLER_CHECK(cond)
#endif
#ifndef debug_assert
#ifdef NDEBUG
#define debug_assert(cond) ((void)0)
#else
#define debug_assert(cond) PTO_SIMPLER_CHECK(cond)
#endif
#endif

#endif /* PTO_SIMPLER_CHECK_H */

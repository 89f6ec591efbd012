// <immintrin.h>, included once for every file of ft that uses x86 intrinsics. The intrinsics are
// usable in any function whose target has their instructions (isa.h's regions, or a function's
// own target attribute). GCC 12 warns inside its own intrinsics (their _mm512_undefined_*
// self-initialise on purpose, which -Wmaybe-uninitialized and -Wuninitialized report at the
// caller); clang has no such warning groups (and says so), hence GCC only.
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

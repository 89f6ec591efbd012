// FT_ASAN: 1 in a build with AddressSanitizer, else 0. GCC defines __SANITIZE_ADDRESS__; clang
// (19 included) does not and answers __has_feature(address_sanitizer) instead, so code that
// tests only the macro silently loses its ASan handling under clang.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define FT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FT_ASAN 1
#endif
#endif
#ifndef FT_ASAN
#define FT_ASAN 0
#endif

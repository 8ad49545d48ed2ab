// shim.h: lets the kernel sources in kernels/*.cu compile as plain C++ for the host emulator
// (build.rs builds them into the library; src/backend/gpu/emu.rs runs them). A launch runs
// every thread of a range of blocks one after another on the calling host thread; the kernel
// rules in common.cuh (no communication between threads) make that exact.
#pragma once
#include <math.h>
#include <string.h>
#include <cstddef>
#include <type_traits>
#include <utility>

#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict

struct ns_dim3 {
    unsigned int x, y, z;
};

// The launch indices of the thread being emulated on this host thread.
extern thread_local ns_dim3 threadIdx, blockIdx, blockDim, gridDim;

// Calls kernel `f` with its arguments read from `params[i]` (each a pointer to the value, the
// convention of cuLaunchKernel).
template <typename... A, std::size_t... I>
inline void ns_emu_call_impl(void (*f)(A...), void** params, std::index_sequence<I...>) {
    f(*static_cast<typename std::remove_reference<A>::type*>(params[I])...);
}

template <typename... A>
inline void ns_emu_call(void (*f)(A...), void** params) {
    ns_emu_call_impl(f, params, std::index_sequence_for<A...>{});
}

template <typename... A>
inline int ns_emu_arity(void (*)(A...)) {
    return (int)sizeof...(A);
}

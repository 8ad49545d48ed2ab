//! Build script: embeds the CUDA kernel sources and builds them for the host emulator.
//!
//! Every `kernels/*.cu` file is one kernel family. This script
//! 1. writes `$OUT_DIR/kernel_sources.rs`: the families' names and sources (`include_str!`), used
//!    by `backend::gpu::kernels` to compile them with NVRTC at run time;
//! 2. writes `$OUT_DIR/emu_all.cpp`, one C++ translation unit holding `kernels/emu/shim.h`,
//!    `kernels/common.cuh`, every family, and a launch table with each kernel's argument
//!    signature, and compiles it (the `cc` crate, C++17, `-ffp-contract=off`) into the static
//!    library `ns_emu` that `backend::gpu::emu` calls. Kernels are found by the pattern
//!    `extern "C" __global__ void NAME(`.
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

#[path = "src/backend/gpu/kernel_scan.rs"]
mod kernel_scan;
use kernel_scan::kernel_names;

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let kernels = root.join("kernels");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    println!("cargo:rerun-if-changed=kernels");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/backend/gpu/kernel_scan.rs");

    let mut families: Vec<PathBuf> = std::fs::read_dir(&kernels)
        .expect("kernels/ directory")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    families.sort();
    for f in &families {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    let common = kernels.join("common.cuh");
    let shim = kernels.join("emu").join("shim.h");
    println!("cargo:rerun-if-changed={}", common.display());
    println!("cargo:rerun-if-changed={}", shim.display());

    // 1. Embedded sources for NVRTC.
    let mut rs = String::new();
    writeln!(
        rs,
        "/// `kernels/common.cuh`, prepended to every family.\npub const COMMON: &str = include_str!({:?});",
        common.display().to_string()
    )
    .unwrap();
    writeln!(
        rs,
        "/// `(family, source)` of every `kernels/*.cu`, sorted by name.\npub const FAMILIES: &[(&str, &str)] = &["
    )
    .unwrap();
    let stem = |p: &Path| p.file_stem().unwrap().to_string_lossy().into_owned();
    for f in &families {
        writeln!(
            rs,
            "    ({:?}, include_str!({:?})),",
            stem(f),
            f.display().to_string()
        )
        .unwrap();
    }
    writeln!(rs, "];").unwrap();
    std::fs::write(out.join("kernel_sources.rs"), rs).unwrap();

    // 2. The host emulator.
    let mut cpp = String::new();
    writeln!(cpp, "#include {:?}", shim.display().to_string()).unwrap();
    writeln!(
        cpp,
        "thread_local ns_dim3 threadIdx, blockIdx, blockDim, gridDim;"
    )
    .unwrap();
    writeln!(cpp, "#include {:?}", common.display().to_string()).unwrap();
    let mut names = Vec::new();
    for f in &families {
        writeln!(cpp, "#include {:?}", f.display().to_string()).unwrap();
        let src = std::fs::read_to_string(f).unwrap();
        names.extend(kernel_names(&src));
    }
    cpp.push_str(
        r#"
template <typename T> struct ns_code { static const char c = '?'; };
template <typename T> struct ns_code<T*> { static const char c = 'p'; };
template <> struct ns_code<int> { static const char c = 'i'; };
template <> struct ns_code<unsigned int> { static const char c = 'u'; };
template <> struct ns_code<long long> { static const char c = 'l'; };
template <> struct ns_code<unsigned long long> { static const char c = 'U'; };
template <> struct ns_code<float> { static const char c = 'f'; };
template <typename... A> const char* ns_sig(void (*)(A...)) {
    static const char s[] = {ns_code<A>::c..., 0};
    return s;
}
typedef void (*ns_wrap_fn)(void**);
struct ns_entry { const char* name; ns_wrap_fn wrap; const char* (*sig)(); };
"#,
    );
    for n in &names {
        writeln!(
            cpp,
            "static void ns_wrap_{n}(void** p) {{ ns_emu_call({n}, p); }}\nstatic const char* ns_sig_{n}() {{ return ns_sig({n}); }}"
        )
        .unwrap();
    }
    writeln!(cpp, "static const ns_entry ns_table[] = {{").unwrap();
    for n in &names {
        writeln!(cpp, "    {{\"{n}\", ns_wrap_{n}, ns_sig_{n}}},").unwrap();
    }
    writeln!(cpp, "    {{0, 0, 0}}}};").unwrap();
    writeln!(cpp, "static const int ns_count = {};", names.len()).unwrap();
    cpp.push_str(
        r#"
extern "C" int ns_emu_kernel_count() { return ns_count; }
extern "C" const char* ns_emu_kernel_name(int i) { return (i >= 0 && i < ns_count) ? ns_table[i].name : 0; }
extern "C" const char* ns_emu_kernel_sig(int i) { return (i >= 0 && i < ns_count) ? ns_table[i].sig() : 0; }
// Runs blocks [b0, b1) of a launch of kernel `index` with `grid` x `block` threads, in
// ascending order, or in descending order of blocks and threads when `reverse` (a kernel whose
// threads depend on each other's writes then computes something else).
extern "C" void ns_emu_run(int index, unsigned grid, unsigned block, unsigned b0, unsigned b1, int reverse,
                           void** params) {
    gridDim.x = grid; gridDim.y = 1; gridDim.z = 1;
    blockDim.x = block; blockDim.y = 1; blockDim.z = 1;
    for (unsigned i = 0; i < b1 - b0; ++i) {
        unsigned b = reverse ? b1 - 1 - i : b0 + i;
        blockIdx.x = b; blockIdx.y = 0; blockIdx.z = 0;
        for (unsigned j = 0; j < block; ++j) {
            unsigned t = reverse ? block - 1 - j : j;
            threadIdx.x = t; threadIdx.y = 0; threadIdx.z = 0;
            ns_table[index].wrap(params);
        }
    }
}
"#,
    );
    let cpp_path = out.join("emu_all.cpp");
    std::fs::write(&cpp_path, cpp).unwrap();
    cc::Build::new()
        .cpp(true)
        .file(&cpp_path)
        .flag_if_supported("-std=c++17")
        .flag_if_supported("-ffp-contract=off")
        .flag_if_supported("-fno-fast-math")
        .flag_if_supported("-Wno-unused-function")
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-unknown-pragmas")
        .opt_level(2)
        .compile("ns_emu");
}

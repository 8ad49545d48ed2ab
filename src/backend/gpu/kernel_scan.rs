//! Finds the kernels of a family's source: every `extern "C" __global__ void NAME(`. Shared by
//! build.rs (which includes this file by path to build the emulator's launch table) and
//! [`super::kernels`] (which maps kernel names to families for NVRTC), so both see the same list.

/// The kernel names of a family's source, in order.
pub fn kernel_names(src: &str) -> Vec<String> {
    let key = "extern \"C\" __global__ void ";
    let mut out = Vec::new();
    let mut rest = src;
    while let Some(i) = rest.find(key) {
        rest = &rest[i + key.len()..];
        out.push(
            rest.chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect(),
        );
    }
    out
}

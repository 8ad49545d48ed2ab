//! The NVRTC disk cache refuses damaged entries (`backend::gpu::kernels`): a CUBIN is an ELF
//! image whose magic survives truncation, so each file carries its length and sha256 and a file
//! that does not check out is rebuilt, never loaded. The round trip needs nothing; the rebuild
//! through the binary needs the NVRTC library and skips itself without it.

use needlescope::backend::gpu::kernels::{
    nvrtc_version, seal_cache_entry, unseal_cache_entry, CACHE_EXTENSION,
};
use std::process::Command;

/// A stand-in CUBIN: ELF magic and some bytes.
fn image() -> Vec<u8> {
    let mut v = b"\x7fELF".to_vec();
    v.extend((0..5000u32).map(|i| (i * 7 + 3) as u8));
    v
}

#[test]
fn sealed_entry_round_trips() {
    let img = image();
    let file = seal_cache_entry(&img);
    assert_eq!(unseal_cache_entry(&file), Some(&img[..]));
}

#[test]
fn truncated_damaged_or_unsealed_entries_are_refused() {
    let img = image();
    let file = seal_cache_entry(&img);
    // Every truncation keeps the ELF magic (the old check's only test) once past 4 bytes.
    for cut in [0, 3, 4, 100, img.len(), img.len() + 1, file.len() - 1] {
        assert_eq!(
            unseal_cache_entry(&file[..cut]),
            None,
            "a file cut to {cut} of {} bytes was accepted",
            file.len()
        );
    }
    for at in [
        5,
        img.len() / 2,
        img.len() - 1,
        img.len() + 3,
        file.len() - 1,
    ] {
        let mut bad = file.clone();
        bad[at] ^= 0x10;
        assert_eq!(
            unseal_cache_entry(&bad),
            None,
            "byte {at} flipped was accepted"
        );
    }
    // A bare CUBIN (the earlier unsealed format) or a non-ELF image is not an entry.
    assert_eq!(unseal_cache_entry(&img), None);
    let not_elf = seal_cache_entry(b"garbage that is not an ELF image at all........");
    assert_eq!(unseal_cache_entry(&not_elf), None);
}

/// `doctor --compile-kernels sm_90` into `cache`: (family, bytes, from the disk cache) per line.
fn doctor(cache: &std::path::Path) -> Vec<(String, usize, bool)> {
    let out = Command::new(env!("CARGO_BIN_EXE_needlescope"))
        .args(["doctor", "--compile-kernels", "sm_90"])
        .env("NEEDLESCOPE_KERNEL_CACHE", cache)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "doctor failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text.lines()
        .filter(|l| l.trim_start().starts_with("ok") && l.contains(".cu"))
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let family = w.iter().find(|s| s.ends_with(".cu")).unwrap().to_string();
            let bytes_at = w.iter().position(|&s| s == "bytes").unwrap();
            (
                family,
                w[bytes_at - 1].parse().unwrap(),
                l.contains("(disk cache)"),
            )
        })
        .collect()
}

#[test]
fn truncated_disk_cache_entry_is_rebuilt_not_loaded() {
    if nvrtc_version().is_err() {
        eprintln!("skipped: no NVRTC library");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let first = doctor(dir.path());
    assert!(!first.is_empty() && first.iter().all(|(_, _, disk)| !disk));
    // Truncate one entry (a torn copy, a full disk, a crash before the data reached the disk):
    // it still starts with the ELF magic.
    let entry = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.extension().is_some_and(|x| x == CACHE_EXTENSION)
                && p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("attention-")
        })
        .expect("the attention family's cache file");
    let whole = std::fs::read(&entry).unwrap();
    assert!(whole.starts_with(b"\x7fELF"));
    std::fs::write(&entry, &whole[..1000]).unwrap();
    let second = doctor(dir.path());
    for ((family, bytes, disk), (_, want, _)) in second.iter().zip(&first) {
        if family == "attention.cu" {
            assert!(!disk, "the truncated entry was taken from the disk cache");
        } else {
            assert!(disk, "{family}: an intact entry was not reused");
        }
        assert_eq!(bytes, want, "{family}: CUBIN of another size");
    }
    assert_eq!(
        std::fs::read(&entry).unwrap(),
        whole,
        "the entry was not rewritten whole"
    );
}

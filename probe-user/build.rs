//! Builds the BPF programs (`probe-ebpf`) for the bpf target with aya-build and leaves the
//! object in OUT_DIR, where `src/trace/bpf.rs` embeds it. Needs nightly + rust-src + bpf-linker:
//! `cargo xtask setup` installs them.
use std::path::PathBuf;

fn main() -> anyhow::Result<()> {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let ebpf_dir = manifest.join("../probe-ebpf");
    let ebpf_dir = ebpf_dir.to_str().expect("utf-8 path");
    println!("cargo:rerun-if-changed=../probe-common/src");
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "probe-ebpf",
            root_dir: ebpf_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )
}

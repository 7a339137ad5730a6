//! Rebuild the BPF object when the linker changes (aya's template does the same).
fn main() {
    if let Ok(linker) = which::which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
}

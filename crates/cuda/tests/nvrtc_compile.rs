//! Every kernel source compiles with NVRTC for Hopper (`sm_90a`) and defines the
//! kernels the backend looks up. Needs only libnvrtc (no GPU): install it with
//! `pip install nvidia-cuda-nvrtc==13.0.*` and put its `lib` folder on
//! LD_LIBRARY_PATH. Skips with a message when NVRTC is absent, unless
//! `DS4_REQUIRE_GPU=1`.

use ds4_cuda::compile::{SOURCES, compile, nvrtc_present, nvrtc_version};

fn required() -> bool {
    std::env::var("DS4_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

#[test]
fn every_kernel_compiles_for_sm_90a() {
    if !nvrtc_present() {
        assert!(
            !required(),
            "DS4_REQUIRE_GPU=1 but libnvrtc is not on the library path"
        );
        eprintln!("skipped: libnvrtc not found (set LD_LIBRARY_PATH to a CUDA 13 lib folder)");
        return;
    }
    eprintln!("NVRTC {:?}", nvrtc_version().unwrap());
    for s in SOURCES {
        let ptx = compile(s.file, s.text, "sm_90a", false).unwrap_or_else(|e| panic!("{e}"));
        let ptx = String::from_utf8_lossy(&ptx);
        for k in s.kernels {
            assert!(
                ptx.contains(&format!(".entry {k}(")),
                "{}: kernel {k} not in the PTX",
                s.file
            );
        }
        let cubin = compile(s.file, s.text, "sm_90a", true).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            cubin.starts_with(b"\x7fELF"),
            "{}: NVRTC did not return an ELF CUBIN",
            s.file
        );
    }
}

//! The per-container supervisor of the `kubelet-process` runtime. Not meant to be run by hand:
//! the runtime starts it (see `kubelet_process::shim`).

use std::process::ExitCode;

fn main() -> ExitCode {
    kubelet_process::shim::run_shim(std::env::args_os().skip(1))
}

//! PyTorch and Hugging Face `datasets` for the distributed and datasets
//! jobs: the `PYTHONPATH`s `cargo xtask test` installs.

use std::path::PathBuf;

/// PyTorch for the distributed-run tests, a directory for `PYTHONPATH`:
/// $STALL_TORCH_PATH (`cargo xtask test` installs it and sets it).
pub fn torch_path() -> PathBuf {
    let dir = std::env::var_os("STALL_TORCH_PATH").map(PathBuf::from).unwrap_or_else(|| {
        panic!("STALL_TORCH_PATH is not set: run the tests with `cargo xtask test`, which installs PyTorch")
    });
    assert!(dir.join("torch/__init__.py").exists(), "no PyTorch in {} (STALL_TORCH_PATH)", dir.display());
    dir
}

/// PyTorch and Hugging Face `datasets`, as one `PYTHONPATH`: the datasets
/// directory ($STALL_DATASETS_PATH, `cargo xtask test` installs it) before
/// PyTorch's.
pub fn torch_and_datasets_path() -> PathBuf {
    let dir = std::env::var_os("STALL_DATASETS_PATH").map(PathBuf::from).unwrap_or_else(|| {
        panic!("STALL_DATASETS_PATH is not set: run the tests with `cargo xtask test`, which installs it")
    });
    assert!(
        dir.join("datasets/__init__.py").exists(),
        "no datasets in {} (STALL_DATASETS_PATH)",
        dir.display()
    );
    PathBuf::from(format!("{}:{}", dir.display(), torch_path().display()))
}

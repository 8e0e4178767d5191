//! NCCL, loaded at run time by the names its packages install: `libnccl.so.2` (the runtime
//! library of PyPI's `nvidia-nccl` wheels, NVIDIA's `libnccl2` package and CUDA runtime
//! containers), then `libnccl.so` (the development link). The types are cudarc's bindings; only
//! the loading is lake's, because cudarc asks for `libnccl.so` and CUDA-versioned names and never
//! for the runtime name (docs/decisions/0031-nccl-by-its-soname.md).
//!
//! The library is looked for once per process, through `LD_LIBRARY_PATH` and then the binary's
//! run path, which holds the torch wheel's `nvidia/nccl/lib` when lake's trainer was built
//! against that wheel (docs/decisions/0030-run-path-to-libtorch.md).

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;

use cudarc::nccl::sys::{cudaStream_t, ncclResult_t};
pub use cudarc::nccl::sys::{ncclComm_t as Comm, ncclDataType_t as DataType, ncclRedOp_t as ReduceOp, ncclUniqueId as UniqueId};

/// The library names tried, in this order.
pub const LIBRARY_NAMES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];

type GetVersion = unsafe extern "C" fn(*mut c_int) -> ncclResult_t;
type GetUniqueId = unsafe extern "C" fn(*mut UniqueId) -> ncclResult_t;
type CommInitRank = unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int) -> ncclResult_t;
type AllReduce = unsafe extern "C" fn(*const c_void, *mut c_void, usize, DataType, ReduceOp, Comm, cudaStream_t) -> ncclResult_t;
type Broadcast = unsafe extern "C" fn(*const c_void, *mut c_void, usize, DataType, c_int, Comm, cudaStream_t) -> ncclResult_t;
type CommDestroy = unsafe extern "C" fn(Comm) -> ncclResult_t;
type GetErrorString = unsafe extern "C" fn(ncclResult_t) -> *const c_char;
type GetLastError = unsafe extern "C" fn(Comm) -> *const c_char;

/// The loaded library: the functions lake's collectives call.
pub struct Nccl {
    name: &'static str,
    version: c_int,
    get_unique_id: GetUniqueId,
    comm_init_rank: CommInitRank,
    all_reduce: AllReduce,
    broadcast: Broadcast,
    comm_destroy: CommDestroy,
    get_error_string: GetErrorString,
    // NCCL 2.13 and later.
    get_last_error: Option<GetLastError>,
    // Keeps the functions above loaded.
    _library: libloading::Library,
}

impl std::fmt::Debug for Nccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nccl").field("name", &self.name).field("version", &self.version).finish()
    }
}

/// NCCL, loaded on first use; or why it is not here, naming every library tried.
///
/// # Errors
/// The names tried and the loader's answer for each, or the function the library lacks.
pub fn library() -> std::result::Result<&'static Nccl, String> {
    static LIBRARY: OnceLock<std::result::Result<Nccl, String>> = OnceLock::new();
    LIBRARY.get_or_init(load).as_ref().map_err(Clone::clone)
}

fn load() -> std::result::Result<Nccl, String> {
    let mut refused = Vec::new();
    for name in LIBRARY_NAMES {
        // SAFETY: loading NCCL runs its initialisers, which only set up its own state.
        match unsafe { libloading::Library::new(name) } {
            Ok(library) => return Nccl::from_library(name, library),
            Err(e) => refused.push(crate::loader_error(&e)),
        }
    }
    Err(format!("no NCCL library on the library path ({})", refused.join("; ")))
}

impl Nccl {
    fn from_library(name: &'static str, library: libloading::Library) -> std::result::Result<Nccl, String> {
        // The loader's error names the library's path and the symbol.
        fn symbol<T: Copy>(library: &libloading::Library, symbol: &[u8]) -> std::result::Result<T, String> {
            // SAFETY: each type above is the function's signature in NCCL's `nccl.h` (2.x).
            unsafe { library.get::<T>(symbol) }.map(|f| *f).map_err(|e| crate::loader_error(&e))
        }
        let get_version: GetVersion = symbol(&library, b"ncclGetVersion\0")?;
        let mut version = 0;
        // SAFETY: `version` receives the version code.
        let result = unsafe { get_version(&mut version) };
        if result != ncclResult_t::ncclSuccess {
            return Err(format!("{name}: ncclGetVersion failed ({result:?})"));
        }
        Ok(Nccl {
            name,
            version,
            get_unique_id: symbol(&library, b"ncclGetUniqueId\0")?,
            comm_init_rank: symbol(&library, b"ncclCommInitRank\0")?,
            all_reduce: symbol(&library, b"ncclAllReduce\0")?,
            broadcast: symbol(&library, b"ncclBroadcast\0")?,
            comm_destroy: symbol(&library, b"ncclCommDestroy\0")?,
            get_error_string: symbol(&library, b"ncclGetErrorString\0")?,
            get_last_error: symbol(&library, b"ncclGetLastError\0").ok(),
            _library: library,
        })
    }

    /// NCCL's version code: 22809 for 2.28.9.
    pub fn version(&self) -> i32 {
        self.version
    }

    /// The version as `major.minor.patch`.
    pub fn version_string(&self) -> String {
        version_string(self.version)
    }

    /// A new unique id, which names one communicator to every rank that joins it.
    ///
    /// # Errors
    /// NCCL's error, with its text.
    pub fn unique_id(&self) -> std::result::Result<UniqueId, String> {
        let mut id = UniqueId { internal: [0; 128] };
        // SAFETY: `id` receives the id.
        self.check(unsafe { (self.get_unique_id)(&mut id) }, std::ptr::null_mut())?;
        Ok(id)
    }

    /// Opens this rank's communicator on the current device.
    ///
    /// # Errors
    /// NCCL's error, with its text.
    ///
    /// # Safety
    /// A CUDA context must be current on this thread; every rank must call it with the same id
    /// and size.
    pub unsafe fn comm_init_rank(&self, size: i32, id: UniqueId, rank: i32) -> std::result::Result<Comm, String> {
        let mut comm = std::ptr::null_mut();
        // SAFETY: `comm` receives the communicator; the caller upholds the rest.
        self.check(unsafe { (self.comm_init_rank)(&mut comm, size, id, rank) }, std::ptr::null_mut())?;
        Ok(comm)
    }

    /// Sums `count` values in place across the communicator's ranks, on `stream` (null: the
    /// default stream).
    ///
    /// # Errors
    /// NCCL's error, with its text and its last message for the communicator.
    ///
    /// # Safety
    /// `data` is `count` values of `kind` in the communicator's device memory, alive until the
    /// stream has run the sum; `comm` is open.
    pub unsafe fn all_reduce_sum(
        &self,
        data: *mut c_void,
        count: usize,
        kind: DataType,
        comm: Comm,
        stream: cudaStream_t,
    ) -> std::result::Result<(), String> {
        // SAFETY: the caller upholds the contract.
        self.check(unsafe { (self.all_reduce)(data, data, count, kind, ReduceOp::ncclSum, comm, stream) }, comm)
    }

    /// Copies rank `root`'s `count` values over every rank's, in place.
    ///
    /// # Errors
    /// As [`Nccl::all_reduce_sum`].
    ///
    /// # Safety
    /// As [`Nccl::all_reduce_sum`].
    pub unsafe fn broadcast(
        &self,
        data: *mut c_void,
        count: usize,
        kind: DataType,
        root: i32,
        comm: Comm,
        stream: cudaStream_t,
    ) -> std::result::Result<(), String> {
        // SAFETY: the caller upholds the contract.
        self.check(unsafe { (self.broadcast)(data, data, count, kind, root, comm, stream) }, comm)
    }

    /// Closes a communicator once its work has finished.
    ///
    /// # Errors
    /// NCCL's error, with its text.
    ///
    /// # Safety
    /// `comm` is open and is not used again.
    pub unsafe fn comm_destroy(&self, comm: Comm) -> std::result::Result<(), String> {
        // SAFETY: the caller upholds the contract.
        self.check(unsafe { (self.comm_destroy)(comm) }, std::ptr::null_mut())
    }

    /// `Ok` for success; otherwise NCCL's text for the result, and its last message (about
    /// `comm`, or the process's when null) where it left one.
    fn check(&self, result: ncclResult_t, comm: Comm) -> std::result::Result<(), String> {
        if result == ncclResult_t::ncclSuccess {
            return Ok(());
        }
        // SAFETY: both return NCCL's static or thread-local strings, or null.
        let (text, last) = unsafe { (text((self.get_error_string)(result)), self.get_last_error.and_then(|last| text(last(comm)))) };
        let text = text.unwrap_or_else(|| format!("{result:?}"));
        Err(match last {
            Some(last) if !last.is_empty() => format!("{text}: {last}"),
            _ => text,
        })
    }
}

/// NCCL's version code as `major.minor.patch` (codes from 2.9 on are `major*10000 +
/// minor*100 + patch`).
pub fn version_string(code: i32) -> String {
    format!("{}.{}.{}", code / 10000, code / 100 % 100, code % 100)
}

/// A C string NCCL returned, when not null.
///
/// # Safety
/// `p` is null or a NUL-terminated string alive for the call.
unsafe fn text(p: *const c_char) -> Option<String> {
    // SAFETY: the caller upholds the contract.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().trim().to_owned())
}

#[cfg(test)]
#[allow(clippy::print_stderr)]
mod tests {
    use super::*;

    #[test]
    fn versions_read_as_nccl_writes_them() {
        assert_eq!(version_string(22809), "2.28.9");
        assert_eq!(version_string(21803), "2.18.3");
    }

    /// Where NCCL is installed (`LAKE_REQUIRE_NCCL=1`: the torch wheel's, which CI has), it loads
    /// by its runtime name, says its version and makes unique ids, none of which needs a GPU.
    #[test]
    fn loads_by_its_runtime_name_where_installed() {
        let nccl = match library() {
            Ok(nccl) => nccl,
            Err(why) => {
                let required = std::env::var("LAKE_REQUIRE_NCCL").is_ok_and(|v| v == "1");
                assert!(!required, "LAKE_REQUIRE_NCCL=1, and {why}");
                for name in LIBRARY_NAMES {
                    assert!(why.contains(name), "the refusal names {name}: {why}");
                }
                eprintln!("skipped: {why}");
                return;
            }
        };
        assert!(nccl.version() >= 20900, "{nccl:?}");
        let (a, b) = (nccl.unique_id().expect("an id"), nccl.unique_id().expect("another id"));
        assert_ne!(a.internal, b.internal, "each id names a new communicator");
    }
}

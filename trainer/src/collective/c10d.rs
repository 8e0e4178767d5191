//! Ranks that a torchrun-style launcher started (`torchrun`, `torch.distributed.run`, a Slurm
//! or Kubernetes job that sets the same variables), joined the way `torch.distributed`'s
//! `env://` joins them: a TCPStore at MASTER_ADDR:MASTER_PORT, then libtorch's Gloo process
//! group over it. Both are libtorch's own (c10d), reached through `csrc/c10d.cpp`.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::time::Duration;

use super::buckets::{Collective, Values};
use crate::{Error, Result};

/// How long a rank waits for the others to meet: torch.distributed's store timeout.
pub const RENDEZVOUS_TIMEOUT: Duration = Duration::from_secs(300);

/// How long one collective waits for every rank: torch.distributed's process-group timeout.
pub const COLLECTIVE_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// The ranks a torchrun-style launcher describes in the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// This process's rank (RANK).
    pub rank: u64,
    /// Number of ranks (WORLD_SIZE).
    pub world_size: u64,
    /// This process's rank on its machine (LOCAL_RANK, 0 when unset): its GPU.
    pub local_rank: u64,
    /// Host of the rendezvous store (MASTER_ADDR).
    pub master_addr: String,
    /// Port of the rendezvous store (MASTER_PORT).
    pub master_port: u16,
    /// Whether the launcher's agent serves the store (torchrun sets
    /// TORCHELASTIC_USE_AGENT_STORE=True); otherwise rank 0 serves it.
    pub agent_store: bool,
}

impl Launch {
    /// The launch this process's environment describes; `None` when neither RANK nor
    /// WORLD_SIZE is set.
    ///
    /// # Errors
    /// [`Error::Ranks`] for a launch that is incomplete or inconsistent, naming the variable.
    pub fn from_env() -> Result<Option<Launch>> {
        Launch::from_vars(|name| std::env::var(name).ok())
    }

    /// As [`Launch::from_env`], with the variables from `var`.
    ///
    /// # Errors
    /// As [`Launch::from_env`].
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<Launch>> {
        let (rank, world) = (var("RANK"), var("WORLD_SIZE"));
        if rank.is_none() && world.is_none() {
            return Ok(None);
        }
        fn number<T: std::str::FromStr>(name: &str, value: Option<String>) -> Result<T> {
            let value = value.ok_or_else(|| Error::Ranks(format!("{name} is not set, and a torchrun-style launch needs it")))?;
            value.trim().parse().map_err(|_| Error::Ranks(format!("{name}={value:?} is not a number")))
        }
        let world_size: u64 = number("WORLD_SIZE", world)?;
        let rank: u64 = number("RANK", rank)?;
        if world_size == 0 || rank >= world_size {
            return Err(Error::Ranks(format!("RANK={rank} is not one of WORLD_SIZE={world_size} ranks")));
        }
        let local_rank = match var("LOCAL_RANK") {
            Some(value) => number("LOCAL_RANK", Some(value))?,
            None => 0,
        };
        let (master_addr, master_port) = if world_size == 1 {
            (var("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".to_owned()), number("MASTER_PORT", var("MASTER_PORT")).unwrap_or(29500))
        } else {
            let addr = var("MASTER_ADDR").filter(|a| !a.trim().is_empty());
            let addr = addr.ok_or_else(|| Error::Ranks("MASTER_ADDR is not set: the ranks cannot meet without it".to_owned()))?;
            (addr, number("MASTER_PORT", var("MASTER_PORT"))?)
        };
        let agent_store = var("TORCHELASTIC_USE_AGENT_STORE").is_some_and(|v| v.eq_ignore_ascii_case("true"));
        Ok(Some(Launch { rank, world_size, local_rank, master_addr, master_port, agent_store }))
    }
}

mod ffi {
    use std::ffi::{c_char, c_int, c_void};

    #[repr(C)]
    pub struct Store {
        _private: [u8; 0],
    }

    #[repr(C)]
    pub struct Gloo {
        _private: [u8; 0],
    }

    unsafe extern "C" {
        pub fn lake_c10d_store_open(
            host: *const c_char,
            port: u16,
            world_size: c_int,
            is_server: c_int,
            timeout_ms: i64,
            err: *mut c_char,
            err_len: usize,
        ) -> *mut Store;
        pub fn lake_c10d_store_close(store: *mut Store);
        pub fn lake_c10d_store_set(
            store: *mut Store,
            key: *const c_char,
            value: *const u8,
            len: usize,
            err: *mut c_char,
            err_len: usize,
        ) -> c_int;
        pub fn lake_c10d_store_get(
            store: *mut Store,
            key: *const c_char,
            out: *mut u8,
            cap: usize,
            len: *mut usize,
            err: *mut c_char,
            err_len: usize,
        ) -> c_int;
    }

    #[cfg(lake_gloo)]
    unsafe extern "C" {
        pub fn lake_c10d_gloo_open(
            store: *mut Store,
            rank: c_int,
            world_size: c_int,
            timeout_ms: i64,
            err: *mut c_char,
            err_len: usize,
        ) -> *mut Gloo;
        pub fn lake_c10d_gloo_close(gloo: *mut Gloo);
        pub fn lake_c10d_gloo_all_reduce_sum(
            gloo: *mut Gloo,
            data: *mut c_void,
            count: i64,
            dtype: c_int,
            err: *mut c_char,
            err_len: usize,
        ) -> c_int;
        pub fn lake_c10d_gloo_broadcast(
            gloo: *mut Gloo,
            data: *mut c_void,
            count: i64,
            dtype: c_int,
            root: c_int,
            err: *mut c_char,
            err_len: usize,
        ) -> c_int;
    }
}

/// Room for a C++ exception's message.
struct ErrorBuffer([c_char; 1024]);

impl ErrorBuffer {
    fn new() -> Self {
        ErrorBuffer([0; 1024])
    }

    fn ptr(&mut self) -> (*mut c_char, usize) {
        (self.0.as_mut_ptr(), self.0.len())
    }

    fn message(&self) -> String {
        // SAFETY: the buffer starts zeroed and the shim writes a NUL-terminated string within it.
        unsafe { CStr::from_ptr(self.0.as_ptr()) }.to_string_lossy().into_owned()
    }
}

/// A job's rendezvous store (c10d's TCPStore); the keys lake writes are under `lake/`.
pub struct Store {
    raw: *mut ffi::Store,
}

// SAFETY: c10d's TCPStore is safe to use from any thread; lake uses it from one at a time.
unsafe impl Send for Store {}

impl Store {
    /// Meets the job's other ranks at the launch's store, serving it on rank 0 unless the
    /// launcher's agent does; returns once every rank has joined.
    ///
    /// # Errors
    /// [`Error::Ranks`] when the store cannot be served or reached within
    /// [`RENDEZVOUS_TIMEOUT`].
    pub fn connect(launch: &Launch) -> Result<Store> {
        let host = CString::new(launch.master_addr.as_str()).map_err(|_| Error::Ranks("MASTER_ADDR holds a NUL byte".to_owned()))?;
        let world =
            c_int::try_from(launch.world_size).map_err(|_| Error::Ranks(format!("WORLD_SIZE={} is too large", launch.world_size)))?;
        let server = c_int::from(launch.rank == 0 && !launch.agent_store);
        let mut err = ErrorBuffer::new();
        let (e, len) = err.ptr();
        // SAFETY: the host is a valid C string for the call; the shim catches every exception.
        let raw =
            unsafe { ffi::lake_c10d_store_open(host.as_ptr(), launch.master_port, world, server, millis(RENDEZVOUS_TIMEOUT), e, len) };
        if raw.is_null() {
            return Err(Error::Ranks(format!(
                "rank {} of {} could not meet the others at {}:{} (the store {}): {}",
                launch.rank,
                launch.world_size,
                launch.master_addr,
                launch.master_port,
                if server == 1 { "this rank serves" } else { "rank 0 or the launcher serves" },
                err.message()
            )));
        }
        Ok(Store { raw })
    }

    /// Sets `key` to `value` for every rank to read.
    ///
    /// # Errors
    /// [`Error::Ranks`] when the store is unreachable.
    pub fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let key_c = CString::new(key).map_err(|_| Error::Ranks(format!("store key {key:?} holds a NUL byte")))?;
        let mut err = ErrorBuffer::new();
        let (e, len) = err.ptr();
        // SAFETY: valid pointers for the call's duration; the shim copies the value.
        let rc = unsafe { ffi::lake_c10d_store_set(self.raw, key_c.as_ptr(), value.as_ptr(), value.len(), e, len) };
        if rc != 0 {
            return Err(Error::Ranks(format!("setting {key} in the rendezvous store: {}", err.message())));
        }
        Ok(())
    }

    /// `key`'s value, once some rank has set it (waiting up to [`RENDEZVOUS_TIMEOUT`]); it must
    /// be `out.len()` bytes long.
    ///
    /// # Errors
    /// [`Error::Ranks`] on a timeout, an unreachable store, or a value of another length.
    pub fn get_exact(&self, key: &str, out: &mut [u8]) -> Result<()> {
        let key_c = CString::new(key).map_err(|_| Error::Ranks(format!("store key {key:?} holds a NUL byte")))?;
        let mut err = ErrorBuffer::new();
        let (e, len) = err.ptr();
        let mut found = 0usize;
        // SAFETY: `out` is writable for `out.len()` bytes; the shim copies at most that.
        let rc = unsafe { ffi::lake_c10d_store_get(self.raw, key_c.as_ptr(), out.as_mut_ptr(), out.len(), &mut found, e, len) };
        if rc != 0 {
            return Err(Error::Ranks(format!("reading {key} from the rendezvous store: {}", err.message())));
        }
        if found != out.len() {
            return Err(Error::Ranks(format!("{key} in the rendezvous store holds {found} bytes, not {}", out.len())));
        }
        Ok(())
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // SAFETY: `raw` came from `lake_c10d_store_open` and is closed once.
        unsafe { ffi::lake_c10d_store_close(self.raw) }
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").finish_non_exhaustive()
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// libtorch's Gloo process group over the launch's store: collectives on the CPU.
pub struct Gloo {
    #[cfg_attr(not(lake_gloo), allow(dead_code))]
    raw: *mut ffi::Gloo,
    // Dropped after the group, which holds a reference of its own.
    _store: Store,
    rank: u64,
    size: u64,
}

// SAFETY: a c10d process group may be used from any thread; lake calls it from one at a time.
unsafe impl Send for Gloo {}

impl Gloo {
    /// Joins the launch's ranks (see [`Store::connect`]) and opens a Gloo group over them.
    /// The group's TCP device binds to GLOO_SOCKET_IFNAME's interface when it is set, else to the
    /// address this host's name resolves to, as torch.distributed binds it.
    ///
    /// # Errors
    /// [`Error::Ranks`] when the ranks cannot meet, or when this build lacks Gloo.
    pub fn connect(launch: &Launch) -> Result<Gloo> {
        #[cfg(lake_gloo)]
        {
            let store = Store::connect(launch)?;
            let (rank, world) = (launch.rank as c_int, launch.world_size as c_int);
            let mut err = ErrorBuffer::new();
            let (e, len) = err.ptr();
            // SAFETY: `store.raw` is open; the shim catches every exception.
            let raw = unsafe { ffi::lake_c10d_gloo_open(store.raw, rank, world, millis(COLLECTIVE_TIMEOUT), e, len) };
            if raw.is_null() {
                return Err(Error::Ranks(format!("rank {rank} of {world}: libtorch's Gloo group did not form: {}", err.message())));
            }
            Ok(Gloo { raw, _store: store, rank: launch.rank, size: launch.world_size })
        }
        #[cfg(not(lake_gloo))]
        {
            let _ = launch;
            Err(Error::Ranks(
                "this lake was built without Gloo's headers, so ranks started by torchrun cannot meet on the CPU: \
                 install Debian's libgloo-dev (scripts/setup.sh does) and build again, or start the ranks with mpirun"
                    .to_owned(),
            ))
        }
    }

    #[cfg(lake_gloo)]
    fn call(&self, what: &str, values: Values<'_>, f: impl FnOnce(*mut c_void, i64, c_int, *mut c_char, usize) -> c_int) -> Result<()> {
        let (data, count, dtype) = match values {
            Values::F32(v) => (v.as_mut_ptr().cast::<c_void>(), v.len(), 0),
            Values::F64(v) => (v.as_mut_ptr().cast::<c_void>(), v.len(), 1),
            Values::Device(_) => return Err(super::buckets::host_only("Gloo")),
        };
        let mut err = ErrorBuffer::new();
        let (e, len) = err.ptr();
        if f(data, count as i64, dtype, e, len) != 0 {
            return Err(Error::Ranks(format!(
                "rank {} of {}: the {what} failed, so a rank went away or stopped answering: {}",
                self.rank,
                self.size,
                err.message()
            )));
        }
        Ok(())
    }
}

impl Drop for Gloo {
    fn drop(&mut self) {
        #[cfg(lake_gloo)]
        // SAFETY: `raw` came from `lake_c10d_gloo_open` and is closed once, before its store.
        unsafe {
            ffi::lake_c10d_gloo_close(self.raw);
        }
    }
}

impl std::fmt::Debug for Gloo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gloo").field("rank", &self.rank).field("size", &self.size).finish()
    }
}

impl Collective for Gloo {
    fn rank(&self) -> u64 {
        self.rank
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn all_reduce_sum(&self, values: Values<'_>) -> Result<()> {
        #[cfg(lake_gloo)]
        // SAFETY: `data` is writable for `count` values of `dtype` during the call.
        return self.call("all-reduce", values, |data, count, dtype, e, len| unsafe {
            ffi::lake_c10d_gloo_all_reduce_sum(self.raw, data, count, dtype, e, len)
        });
        #[cfg(not(lake_gloo))]
        {
            let _ = values;
            unreachable!("a Gloo group exists only in builds with Gloo")
        }
    }

    fn broadcast(&self, values: Values<'_>) -> Result<()> {
        #[cfg(lake_gloo)]
        // SAFETY: as in `all_reduce_sum`.
        return self.call("broadcast", values, |data, count, dtype, e, len| unsafe {
            ffi::lake_c10d_gloo_broadcast(self.raw, data, count, dtype, 0, e, len)
        });
        #[cfg(not(lake_gloo))]
        {
            let _ = values;
            unreachable!("a Gloo group exists only in builds with Gloo")
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::Launch;

    fn launch(vars: &[(&str, &str)]) -> crate::Result<Option<Launch>> {
        let vars: HashMap<String, String> = vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        Launch::from_vars(|name| vars.get(name).cloned())
    }

    #[test]
    fn torchruns_variables_describe_the_ranks() {
        assert_eq!(launch(&[]).expect("no launch"), None);
        let torchrun = [
            ("RANK", "3"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "node0"),
            ("MASTER_PORT", "29400"),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
        ];
        let found = launch(&torchrun).expect("valid").expect("a launch");
        assert_eq!(
            found,
            Launch { rank: 3, world_size: 4, local_rank: 1, master_addr: "node0".into(), master_port: 29400, agent_store: true }
        );
        // One rank needs no store address.
        let one = launch(&[("RANK", "0"), ("WORLD_SIZE", "1")]).expect("valid").expect("a launch");
        assert_eq!((one.world_size, one.agent_store), (1, false));
    }

    #[test]
    fn an_incomplete_launch_names_what_is_missing() {
        let message = |vars: &[(&str, &str)]| launch(vars).expect_err("refused").to_string();
        assert!(message(&[("RANK", "0")]).contains("WORLD_SIZE is not set"));
        assert!(message(&[("RANK", "2"), ("WORLD_SIZE", "2")]).contains("RANK=2 is not one of WORLD_SIZE=2"));
        assert!(message(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "1")]).contains("MASTER_ADDR is not set"));
        assert!(message(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")]).contains("MASTER_PORT is not set"));
        assert!(message(&[("RANK", "x"), ("WORLD_SIZE", "2")]).contains("RANK=\"x\" is not a number"));
    }
}

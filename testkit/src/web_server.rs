//! A real web server on loopback for tests of HTTP sources: Debian's nginx serving a directory
//! as static files (HEAD, ranged GETs, ETag and Last-Modified, no listing), as a dataset is
//! served by a plain web server or a CDN.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

/// A running nginx, stopped when dropped.
#[derive(Debug)]
pub struct WebServer {
    child: Child,
    url: String,
    dir: tempfile::TempDir,
}

impl WebServer {
    /// Serves the files under `root` at `http://127.0.0.1:PORT/`.
    ///
    /// # Panics
    /// When nginx is not installed (`scripts/setup.sh` installs it) or does not start.
    pub fn serve(root: &Path) -> Self {
        let nginx = ["/usr/sbin/nginx", "/usr/local/sbin/nginx"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
            .expect("nginx is not installed: scripts/setup.sh installs Debian's nginx-light");
        let root = std::path::absolute(root).expect("an absolute path");
        for _ in 0..5 {
            let dir = tempfile::tempdir().expect("tmp");
            // A free port: bound, then let go for nginx (another process may take it between
            // the two; then nginx fails and another port is tried).
            let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
            let d = dir.path().display();
            // As root, workers would drop to `nobody`, who cannot read a test's private files.
            let user = if euid_is_root() { "user root;" } else { "" };
            let conf = format!(
                "{user}\ndaemon off;\nmaster_process on;\nworker_processes 2;\npid {d}/nginx.pid;\nerror_log {d}/error.log;\n\
                 events {{ worker_connections 256; }}\n\
                 http {{\n  access_log {d}/access.log;\n  default_type application/octet-stream;\n  sendfile on;\n\
                 \x20 client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fastcgi;\n\
                 \x20 uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
                 \x20 server {{\n    listen 127.0.0.1:{port};\n    root {};\n    autoindex off;\n  }}\n}}\n",
                root.display()
            );
            std::fs::write(dir.path().join("nginx.conf"), conf).expect("write nginx.conf");
            let mut child = Command::new(&nginx)
                .arg("-p")
                .arg(dir.path())
                .arg("-c")
                .arg(dir.path().join("nginx.conf"))
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start nginx");
            let began = Instant::now();
            while began.elapsed() < Duration::from_secs(10) {
                if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return Self { child, url: format!("http://127.0.0.1:{port}"), dir };
                }
                if child.try_wait().expect("wait").is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("nginx did not start on a free port (5 tries)");
    }

    /// `http://127.0.0.1:PORT`: the URL of the served directory.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The requests served so far whose access-log line holds every one of `words`
    /// (`"METHOD /PATH HTTP/1.1" STATUS …`).
    pub fn requests(&self, words: &[&str]) -> usize {
        std::fs::read_to_string(self.dir.path().join("access.log"))
            .unwrap_or_default()
            .lines()
            .filter(|l| words.iter().all(|w| l.contains(w)))
            .count()
    }
}

fn euid_is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

impl Drop for WebServer {
    fn drop(&mut self) {
        // SIGTERM: nginx's master stops its workers and exits.
        // SAFETY: a signal to the process this handle started.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let _ = self.child.wait();
    }
}

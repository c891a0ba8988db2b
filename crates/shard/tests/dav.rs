//! WebDAV's write methods (`dav_methods`, `dav_access`, `create_full_put_path`,
//! `min_delete_depth`): each method's answers, the files they leave, and nginx's refusals.

mod support;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;

use support::*;

const CONF: &str =
    "worker_processes 1;\nerror_log {dir}/logs/error.log info;\nevents {}\nhttp {\n \
    client_body_buffer_size 16k;\n \
    server {\n  listen 127.0.0.1:{port};\n  absolute_redirect off;\n  root {dir}/html;\n  \
    location = /status { shard_status; }\n  \
    location / { dav_methods PUT DELETE MKCOL COPY MOVE; dav_access group:r all:r; }\n  \
    location /deep/ { dav_methods PUT; create_full_put_path on; }\n  \
    location /guard/ { dav_methods DELETE; min_delete_depth 3; }\n  \
    location /ro/ { dav_methods off; }\n }\n}\n";

fn start(tag: &str) -> (Server, PathBuf) {
    let s = Server::start(tag, CONF, 1);
    let html = s.dir.join("html");
    // The workers run as an unprivileged user: the tree is theirs to write.
    std::fs::set_permissions(&html, std::fs::Permissions::from_mode(0o777)).unwrap();
    (s, html)
}

/// Sends `method target` with `headers` (lines) and `body`; answers status, headers, body.
fn req(s: &Server, method: &str, target: &str, headers: &str, body: &[u8]) -> Response {
    let mut r = format!("{method} {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    if !body.is_empty() {
        r.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    r.push_str(headers);
    r.push_str("\r\n");
    let mut bytes = r.into_bytes();
    bytes.extend_from_slice(body);
    raw(s.addr(), &bytes)
}

#[test]
fn put_creates_replaces_and_refuses_as_nginx() {
    let (s, html) = start("dav-put");
    let r = req(&s, "PUT", "/a%20b.txt", "", b"0123456789");
    assert_eq!(r.status, 201, "{}", r.body_str());
    assert_eq!(r.header("Content-Length"), Some("0"));
    assert_eq!(r.header("Location"), Some("/a%20b.txt"));
    assert_eq!(std::fs::read(html.join("a b.txt")).unwrap(), b"0123456789");
    // `dav_access group:r all:r`: the user keeps rw.
    let mode = std::fs::metadata(html.join("a b.txt")).unwrap().mode() & 0o777;
    assert_eq!(mode, 0o644);
    // Again: replaced, 204 with no length; the `Date` header dates the file.
    let r = req(
        &s,
        "PUT",
        "/a%20b.txt",
        "Date: Sun, 06 Nov 1994 08:49:37 GMT\r\n",
        b"xyz",
    );
    assert_eq!(r.status, 204);
    assert_eq!(r.header("Content-Length"), None);
    let meta = std::fs::metadata(html.join("a b.txt")).unwrap();
    assert_eq!((meta.len(), meta.mtime()), (3, 784_111_777));
    // A body over client_body_buffer_size went to a temporary file first: all of it lands.
    let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let r = req(&s, "PUT", "/big.bin", "", &big);
    assert_eq!(r.status, 201);
    assert_eq!(std::fs::read(html.join("big.bin")).unwrap(), big);
    // A chunked body.
    let r = raw(
        s.addr(),
        b"PUT /c.txt HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
          Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
    );
    assert_eq!(r.status, 201);
    assert_eq!(std::fs::read(html.join("c.txt")).unwrap(), b"abcde");
    // Refusals: a collection, a range, a missing directory, a directory in the way.
    assert_eq!(req(&s, "PUT", "/dir/", "", b"x").status, 409);
    assert_eq!(
        req(&s, "PUT", "/r.txt", "Content-Range: bytes 0-0/1\r\n", b"x").status,
        501
    );
    assert_eq!(req(&s, "PUT", "/no/such/f", "", b"x").status, 409);
    std::fs::create_dir(html.join("isdir")).unwrap();
    assert_eq!(req(&s, "PUT", "/isdir", "", b"x").status, 409);
    // `create_full_put_path on` makes the directories.
    let r = req(&s, "PUT", "/deep/x/y/z.txt", "", b"deep");
    assert_eq!(r.status, 201);
    assert_eq!(std::fs::read(html.join("deep/x/y/z.txt")).unwrap(), b"deep");
    // No temporary file is left beside what was put.
    let left: Vec<_> = std::fs::read_dir(&html)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains("shard-put"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    // `dav_methods off`: nginx's 405 for a method the static module does not take.
    assert_eq!(req(&s, "PUT", "/ro/f", "", b"x").status, 405);
    // GET still serves the files.
    assert_eq!(req(&s, "GET", "/c.txt", "", b"").body_str(), "abcde");
}

#[test]
fn mkcol_delete_copy_and_move() {
    let (s, html) = start("dav-tree");
    let r = req(&s, "MKCOL", "/d/", "", b"");
    assert_eq!(r.status, 201);
    assert_eq!(r.header("Location"), Some("/d/"));
    assert!(html.join("d").is_dir());
    assert_eq!(req(&s, "MKCOL", "/d/", "", b"").status, 405);
    assert_eq!(req(&s, "MKCOL", "/e", "", b"").status, 409);
    assert_eq!(req(&s, "MKCOL", "/f/", "", b"body").status, 415);
    std::fs::write(html.join("d/one"), b"1").unwrap();
    // (Made by the test, as root: opened to the workers' user.)
    std::fs::create_dir(html.join("d/sub")).unwrap();
    std::fs::set_permissions(html.join("d/sub"), std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::write(html.join("d/sub/two"), b"22").unwrap();

    // COPY a collection: the tree; MOVE it: gone from the source.
    let r = req(&s, "COPY", "/d/", "Destination: /copy/\r\n", b"");
    assert_eq!(r.status, 201);
    assert_eq!(std::fs::read(html.join("copy/sub/two")).unwrap(), b"22");
    assert_eq!(
        req(&s, "COPY", "/d/", "Destination: /d/inner/\r\n", b"").status,
        403
    );
    let r = req(
        &s,
        "MOVE",
        "/copy/",
        "Destination: http://localhost/moved/\r\n",
        b"",
    );
    assert_eq!(r.status, 201);
    assert!(!html.join("copy").exists());
    assert_eq!(std::fs::read(html.join("moved/one")).unwrap(), b"1");

    // Files: COPY is 204, an existing destination is replaced unless `Overwrite: F`.
    let r = req(&s, "COPY", "/d/one", "Destination: /one%20copy\r\n", b"");
    assert_eq!(r.status, 204);
    assert_eq!(std::fs::read(html.join("one copy")).unwrap(), b"1");
    let r = req(
        &s,
        "COPY",
        "/d/sub/two",
        "Destination: /one%20copy\r\nOverwrite: F\r\n",
        b"",
    );
    assert_eq!(r.status, 412);
    let r = req(
        &s,
        "MOVE",
        "/d/sub/two",
        "Destination: /one%20copy\r\n",
        b"",
    );
    assert_eq!(r.status, 204);
    assert_eq!(std::fs::read(html.join("one copy")).unwrap(), b"22");
    assert!(!html.join("d/sub/two").exists());
    // Refusals: no destination, another host, a depth COPY does not take, a file to a
    // collection name.
    assert_eq!(req(&s, "COPY", "/d/one", "", b"").status, 400);
    let other = "Destination: http://elsewhere/x\r\n";
    assert_eq!(req(&s, "COPY", "/d/one", other, b"").status, 400);
    let depth = "Destination: /x\r\nDepth: 1\r\n";
    assert_eq!(req(&s, "COPY", "/d/one", depth, b"").status, 400);
    assert_eq!(
        req(&s, "COPY", "/d/one", "Destination: /x/\r\n", b"").status,
        409
    );
    assert_eq!(
        req(&s, "COPY", "/d/one", "Destination: /../x\r\n", b"").status,
        400
    );

    // DELETE: a file, a collection (with its slash), what is not there.
    assert_eq!(req(&s, "DELETE", "/one%20copy", "", b"").status, 204);
    assert!(!html.join("one copy").exists());
    assert_eq!(req(&s, "DELETE", "/moved", "", b"").status, 409);
    assert_eq!(
        req(&s, "DELETE", "/moved/", "Depth: 0\r\n", b"").status,
        400
    );
    assert_eq!(req(&s, "DELETE", "/moved/", "", b"").status, 204);
    assert!(!html.join("moved").exists());
    assert_eq!(req(&s, "DELETE", "/nothing", "", b"").status, 404);
    assert_eq!(req(&s, "DELETE", "/d/one", "", b"x").status, 415);
    // `min_delete_depth 3`: /guard/a is too shallow, /guard/a/b/c deep enough.
    std::fs::create_dir_all(html.join("guard/a/b")).unwrap();
    std::fs::set_permissions(
        html.join("guard/a/b"),
        std::fs::Permissions::from_mode(0o777),
    )
    .unwrap();
    std::fs::write(html.join("guard/a/b/c"), b"c").unwrap();
    assert_eq!(req(&s, "DELETE", "/guard/a", "", b"").status, 409);
    assert_eq!(req(&s, "DELETE", "/guard/a/b/c", "", b"").status, 204);
    let log = error_log(&s);
    assert!(log.contains("insufficient URI depth:2 to DELETE"), "{log}");
    assert!(
        log.contains("client sent no \"Destination\" header"),
        "{log}"
    );
}

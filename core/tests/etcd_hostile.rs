//! A hostile (or on-path) etcd endpoint (issue 44.5): a fake member on
//! loopback that answers the JSON gateway's calls with an endless watch
//! line, a listing that says "more" forever, or a 60 MiB reply. Each
//! attack ends in a clear error (or a bounded, reconnecting watch) within
//! seconds, having read a bounded number of bytes, and the process's
//! memory stays small. Before, the same endpoint grew a machine to 5 GB.
//! Issue 55.6: listing pages of empty, repeated or falling names are
//! refused at the first one, and an endpoint that pages validly but slowly
//! forever is cut off at the listing's deadline.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use keyfence::wrap::{EtcdConfig, EtcdStore, Store};

/// What the fake member does.
#[derive(Clone, Copy)]
enum Attack {
    /// A watch stream that never ends its first line.
    EndlessWatchLine,
    /// Every listing page is the same one, with `more: true`.
    MoreForever,
    /// Every read is answered with 60 MiB.
    HugeReply,
    /// Every listing page holds two names in the wrong order, with
    /// `more: true`: its last name never moves on.
    Reordered,
    /// Every listing page is the names asked for less one, each the store
    /// prefix itself (an empty name), then one new, rising name, with
    /// `more: true`: its last name always moves on (issue 55.6).
    EmptyNames,
    /// The first page holds `aa` and `bb`; every later one repeats `bb`,
    /// then `cc`.
    RepeatedAcrossPages,
    /// A page that holds `aa` twice.
    RepeatedInPage,
    /// The first page holds `mm` and `nn`; every later one goes back to
    /// `cc` and `dd`.
    BackwardsAcrossPages,
    /// Every page is one new, rising name, with `more: true`, answered
    /// after 50 ms: valid, slow, forever.
    SlowForever,
}

/// A fake etcd member on a port the OS hands out, serving until dropped.
struct Fake {
    port: u16,
    /// Bytes of bodies written to clients, counted as they go.
    sent: Arc<AtomicUsize>,
    /// Listing pages answered.
    pages: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn fake(attack: Attack) -> Fake {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (sent, pages, stop) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
    let (s, pg, st) = (sent.clone(), pages.clone(), stop.clone());
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            if st.load(Ordering::SeqCst) {
                return;
            }
            let Ok(conn) = conn else { continue };
            let (s, pg, st) = (s.clone(), pg.clone(), st.clone());
            std::thread::spawn(move || serve(conn, attack, &s, &pg, &st));
        }
    });
    Fake { port, sent, pages, stop }
}

/// A range answer at revision 7 holding `keys` (each with the value `x`).
fn page_of(keys: &[String], more: bool) -> String {
    let kvs: Vec<String> = keys.iter().map(|k| format!(r#"{{"key":"{}","value":"{}"}}"#, b64(k), b64("x"))).collect();
    format!(r#"{{"header":{{"revision":"7"}},"kvs":[{}],"more":{more},"count":"{}"}}"#, kvs.join(","), keys.len() + 1)
}

fn serve(conn: TcpStream, attack: Attack, sent: &AtomicUsize, pages: &AtomicUsize, stop: &AtomicBool) {
    conn.set_write_timeout(Some(Duration::from_secs(5))).ok();
    let mut r = BufReader::new(conn.try_clone().unwrap());
    let mut w = conn;
    let mut path = String::new();
    let mut len = 0usize;
    let mut line = String::new();
    while r.read_line(&mut line).unwrap_or(0) > 0 {
        if path.is_empty() {
            path = line.split_whitespace().nth(1).unwrap_or("").to_owned();
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().unwrap_or(0);
        }
        if line == "\r\n" {
            break;
        }
        line.clear();
    }
    let mut body = vec![0; len];
    let _ = r.read_exact(&mut body);
    let head = |w: &mut TcpStream, n: Option<usize>| {
        let length = n.map_or(String::new(), |n| format!("content-length: {n}\r\n"));
        write!(w, "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n{length}connection: close\r\n\r\n")
    };
    let header = r#"{"header":{"revision":"7"}"#;
    // A listing's request: how many names it asks for, and whether it is
    // the first page (from the prefix itself).
    let request: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let listing = path == "/v3/kv/range" && request.get("range_end").is_some();
    let limit = request.get("limit").and_then(serde_json::Value::as_u64).unwrap_or(1000) as usize;
    let first = request.get("key").and_then(serde_json::Value::as_str) == Some(b64("kf/envelopes/").as_str());
    let name = |n: usize| format!("kf/envelopes/{n:08}");
    let send_page = |w: &mut TcpStream, keys: &[String]| {
        pages.fetch_add(1, Ordering::SeqCst);
        let reply = page_of(keys, true);
        let _ = head(w, Some(reply.len()));
        let _ = w.write_all(reply.as_bytes());
        sent.fetch_add(reply.len(), Ordering::SeqCst);
    };
    match (attack, path.as_str()) {
        (Attack::EmptyNames, _) if listing => {
            let mut keys = vec!["kf/".to_owned(); limit.saturating_sub(1)];
            keys.push(name(pages.load(Ordering::SeqCst)));
            send_page(&mut w, &keys);
        }
        (Attack::RepeatedAcrossPages, _) if listing => {
            let keys = if first { ["kf/envelopes/aa", "kf/envelopes/bb"] } else { ["kf/envelopes/bb", "kf/envelopes/cc"] };
            send_page(&mut w, &keys.map(str::to_owned));
        }
        (Attack::RepeatedInPage, _) if listing => send_page(&mut w, &["kf/envelopes/aa".to_owned(), "kf/envelopes/aa".to_owned()]),
        (Attack::BackwardsAcrossPages, _) if listing => {
            let keys = if first { ["kf/envelopes/mm", "kf/envelopes/nn"] } else { ["kf/envelopes/cc", "kf/envelopes/dd"] };
            send_page(&mut w, &keys.map(str::to_owned));
        }
        (Attack::SlowForever, _) if listing => {
            std::thread::sleep(Duration::from_millis(50));
            send_page(&mut w, &[name(pages.load(Ordering::SeqCst))]);
        }
        (Attack::EndlessWatchLine, "/v3/watch") => {
            let _ = head(&mut w, None);
            let chunk = vec![b'a'; 64 << 10];
            while !stop.load(Ordering::SeqCst) && w.write_all(&chunk).is_ok() {
                sent.fetch_add(chunk.len(), Ordering::SeqCst);
            }
        }
        (Attack::MoreForever, "/v3/kv/range") if String::from_utf8_lossy(&body).contains("range_end") => {
            // The same page, forever announcing another (with a value, for
            // a scan; a listing ignores it).
            let reply =
                format!(r#"{header},"kvs":[{{"key":"{}","value":"{}"}}],"more":true,"count":"2"}}"#, b64("kf/envelopes/aa"), b64("x"));
            let _ = head(&mut w, Some(reply.len()));
            let _ = w.write_all(reply.as_bytes());
            sent.fetch_add(reply.len(), Ordering::SeqCst);
        }
        (Attack::Reordered, "/v3/kv/range") if String::from_utf8_lossy(&body).contains("range_end") => {
            let reply = format!(
                r#"{header},"kvs":[{{"key":"{}","value":"{}"}},{{"key":"{}","value":"{}"}}],"more":true,"count":"3"}}"#,
                b64("kf/envelopes/m"),
                b64("x"),
                b64("kf/envelopes/b"),
                b64("y")
            );
            let _ = head(&mut w, Some(reply.len()));
            let _ = w.write_all(reply.as_bytes());
            sent.fetch_add(reply.len(), Ordering::SeqCst);
        }
        (Attack::HugeReply, _) => {
            let n = 60 << 20;
            let _ = head(&mut w, Some(n));
            let _ = w.write_all(br#"{"header":{"revision":"7"},"kvs":[{"key":"a","value":""#);
            let chunk = vec![b'A'; 64 << 10];
            let mut left = n;
            while left > 0 && !stop.load(Ordering::SeqCst) {
                let k = left.min(chunk.len());
                if w.write_all(&chunk[..k]).is_err() {
                    break;
                }
                sent.fetch_add(k, Ordering::SeqCst);
                left -= k;
            }
        }
        _ => {
            // Anything else: a plain empty answer at revision 7.
            let reply = format!("{header}}}");
            let _ = head(&mut w, Some(reply.len()));
            let _ = w.write_all(reply.as_bytes());
        }
    }
}

fn b64(s: &str) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in s.as_bytes().chunks(3) {
        let n = (u32::from(c[0]) << 16) | (u32::from(*c.get(1).unwrap_or(&0)) << 8) | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            out.push(if i <= c.len() { A[(n >> (18 - 6 * i) & 63) as usize] as char } else { '=' });
        }
    }
    out
}

fn store(f: &Fake) -> Arc<EtcdStore> {
    let mut c = EtcdConfig::new(vec![format!("127.0.0.1:{}", f.port)], "kf");
    c.retry_for = Duration::from_secs(2);
    c.watch_idle = Duration::from_secs(2);
    Arc::new(EtcdStore::open(c).unwrap())
}

/// A scan of `envelopes/` in pages of `page` that must fail: its error,
/// and how many pages it handed on first.
fn failed_scan(s: &EtcdStore, page: usize) -> (keyfence::wrap::StoreError, usize) {
    let mut pages = 0;
    let err = s
        .scan("envelopes/", page, &mut |_, _| {
            pages += 1;
            Ok(())
        })
        .unwrap_err();
    (err, pages)
}

/// This process's resident memory, in MiB.
fn rss_mib() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: usize = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).unwrap().split_whitespace().next().unwrap().parse().unwrap();
    kb / 1024
}

#[test]
fn a_listing_that_says_more_forever_fails_at_once() {
    let f = fake(Attack::MoreForever);
    let s = store(&f);
    let t = Instant::now();
    let err = s.list("envelopes/").unwrap_err();
    assert!(err.to_string().contains("does not move on"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    // A scan (what a revocation's re-wrap reads with) takes the first page
    // and refuses the second, the same one again.
    let mut pages = 0;
    let err = s
        .scan("envelopes/", 128, &mut |names, values| {
            assert_eq!((names, values), (vec!["envelopes/aa".to_owned()], vec![Some(b"x".to_vec())]));
            pages += 1;
            Ok(())
        })
        .unwrap_err();
    assert!(err.to_string().contains("does not move on"), "{err}");
    assert_eq!(pages, 1);
}

/// A page whose names go backwards would have its last name never move
/// on, and a scan (a revocation's re-wrap) read and re-wrap the same
/// envelopes forever: refused at the first page.
#[test]
fn a_scan_page_out_of_order_is_refused_at_once() {
    let f = fake(Attack::Reordered);
    let s = store(&f);
    let (err, pages) = failed_scan(&s, 1000);
    assert!(err.to_string().contains("does not move on"), "{err}");
    assert_eq!(pages, 0);
}

/// The `std::io::ErrorKind` and text of a store error that must be an
/// I/O error (`STORE_IO`).
fn io_kind(err: &keyfence::wrap::StoreError) -> (std::io::ErrorKind, String) {
    match err {
        keyfence::wrap::StoreError::Io { source, .. } => (source.kind(), err.to_string()),
        other => panic!("not an I/O error: {other}"),
    }
}

/// Issue 55, item 6: pages of 999 empty names (the store prefix itself)
/// and one new, rising name, each saying "more", moved on by the old rule
/// (its last name rose), and `authority status` ran for as long as the
/// endpoint liked, memory growing 0.5 MB/s. The first page is refused, at
/// once, for a listing and for a scan.
#[test]
fn a_page_of_empty_names_is_refused_at_once() {
    let f = fake(Attack::EmptyNames);
    let s = store(&f);
    let t = Instant::now();
    let err = s.list("envelopes/").unwrap_err();
    let (kind, text) = io_kind(&err);
    assert_eq!(kind, std::io::ErrorKind::InvalidData, "{text}");
    assert!(text.contains("empty name"), "{text}");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert_eq!(f.pages.load(Ordering::SeqCst), 1, "refused at the first page");
    let t = Instant::now();
    let (err, handed) = failed_scan(&s, 1000);
    assert!(io_kind(&err).1.contains("empty name"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert_eq!((handed, f.pages.load(Ordering::SeqCst)), (0, 2));
}

/// A name repeated (within a page or on the next) or a page that goes
/// back is refused at that page, for a listing and for a scan: each says
/// which name and why.
#[test]
fn repeated_names_and_names_that_go_back_are_refused() {
    for (attack, why, pages) in [
        (Attack::RepeatedAcrossPages, "\"envelopes/bb\" repeated", 2),
        (Attack::RepeatedInPage, "\"envelopes/aa\" repeated", 1),
        (Attack::BackwardsAcrossPages, "\"envelopes/cc\" after \"envelopes/nn\" (names must rise)", 2),
    ] {
        let f = fake(attack);
        let s = store(&f);
        let t = Instant::now();
        let (kind, text) = io_kind(&s.list("envelopes/").unwrap_err());
        assert_eq!(kind, std::io::ErrorKind::InvalidData, "{text}");
        assert!(text.contains(why) && text.contains("does not move on"), "{text}");
        assert_eq!(f.pages.load(Ordering::SeqCst), pages, "{text}");
        let (err, handed) = failed_scan(&s, 1000);
        assert!(io_kind(&err).1.contains(why), "{err}");
        // A scan hands on the pages before the bad one.
        assert_eq!(handed, pages - 1, "{err}");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    }
}

/// An endpoint that answers every page validly (a new, rising name) but
/// slowly, forever, is cut off by the listing's deadline (here 1 s; five
/// minutes by default), for a listing and for a scan.
#[test]
fn a_slow_endless_listing_is_cut_off_at_its_deadline() {
    let f = fake(Attack::SlowForever);
    let deadline = Duration::from_secs(1);
    let s = Arc::new(Arc::into_inner(store(&f)).unwrap().with_listing_deadline(deadline));
    for scan in [false, true] {
        let before = f.pages.load(Ordering::SeqCst);
        let t = Instant::now();
        let err = if scan { s.scan("envelopes/", 1, &mut |_, _| Ok(())).unwrap_err() } else { s.list("envelopes/").unwrap_err() };
        let (kind, text) = io_kind(&err);
        assert_eq!(kind, std::io::ErrorKind::TimedOut, "{text}");
        assert!(text.contains("deadline"), "{text}");
        // It ran until the deadline, paging validly, and stopped there.
        assert!(f.pages.load(Ordering::SeqCst) - before >= 3, "scan {scan}: {text}");
        assert!(t.elapsed() >= deadline && t.elapsed() < deadline + Duration::from_secs(5), "scan {scan}: {:?}", t.elapsed());
    }
}

#[test]
fn a_sixty_mebibyte_reply_is_refused_not_read() {
    let before = rss_mib();
    let f = fake(Attack::HugeReply);
    let s = store(&f);
    let t = Instant::now();
    let err = s.get("envelopes/aa").unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert!(err.to_string().contains("reading the answer") || err.to_string().contains("no member answered"), "{err}");
    let grew = rss_mib().saturating_sub(before);
    assert!(grew < 100, "resident memory grew {grew} MiB");
}

#[test]
fn an_endless_watch_line_is_cut_and_the_watch_reconnects() {
    let before = rss_mib();
    let f = fake(Attack::EndlessWatchLine);
    let s = store(&f);
    let watch = s.clone().watch("public/", 7).unwrap();
    // Each connection is dropped after at most one bounded line; the fake
    // keeps sending to new ones. Bytes sent grow by connections, and
    // memory does not follow them.
    std::thread::sleep(Duration::from_secs(4));
    let sent = f.sent.load(Ordering::SeqCst);
    let grew = rss_mib().saturating_sub(before);
    drop(watch);
    assert!(sent > 4 << 20, "the attack did not run: {sent} bytes");
    assert!(grew < 100, "resident memory grew {grew} MiB while {sent} bytes were sent");
}

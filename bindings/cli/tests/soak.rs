//! `keyfence bench soak`, briefly: signing through the engine and an
//! key process that is killed under load, wrap and open on one
//! store; nothing may be lost and no call may wait past its deadline.

mod common;

use common::{keyfence, stderr, stdout, Dir};

#[test]
fn a_short_soak_loses_nothing_and_keeps_every_deadline() {
    let d = Dir::new("soak");
    let o = keyfence(&["bench", "soak", "--seconds", "4", "--threads", "4", "--kill-every-ms", "1000", "--dir", &d.p("run")]);
    assert!(o.status.success(), "exit {:?}: {}{}", o.status.code(), stdout(&o), stderr(&o));
    let r: serde_json::Value = serde_json::from_str(stdout(&o).trim()).expect("one JSON object");
    assert_eq!(r["lost_keys"], 0, "{r}");
    assert_eq!(r["lost_envelopes"], 0, "{r}");
    assert_eq!(r["late_calls"], 0, "{r}");
    assert!(r["kills"].as_u64().unwrap() >= 2, "the key process was killed: {r}");
    assert!(r["restarts"].as_u64().unwrap() >= 2, "and came back: {r}");
    for op in ["sign", "wrap", "open"] {
        assert!(r["operations"][op].as_u64().unwrap() > 0, "{op}: {r}");
    }
    assert!(r["envelopes_checked"].as_u64().unwrap() > 0, "{r}");
    // Failures are only those a killed key process explains.
    for (kind, _) in r["failed"]["sign"].as_object().unwrap() {
        assert!(["backend_died", "backend_unavailable"].contains(&kind.as_str()), "{kind}: {r}");
    }
    assert!(r["failed"]["wrap"].as_object().unwrap().is_empty(), "{r}");
    assert!(r["failed"]["open"].as_object().unwrap().is_empty(), "{r}");
    assert!(r["peak_rss_kb"].as_u64().unwrap() > 0 && r["key_process_peak_rss_kb"].as_u64().unwrap() > 0, "{r}");
}

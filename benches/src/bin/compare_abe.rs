//! Runs CIRCL (through `vectors/circl-oracle bench`) and keyfence (`keyfence
//! bench abe`) on the same machine, alternating round by round so that
//! both see the same conditions, and prints the medians and the ratios
//! CIRCL time / keyfence time. Writes the figures as JSON and an SVG chart.
//!
//! Also prints keyfence's decryption time over its lower bound (the
//! `decrypt_floor_ms` that `keyfence bench abe` measures in the same run),
//! and keyfence on two threads (the `*_2threads` figures `keyfence bench
//! abe` measures alternately with the one-thread ones, in the same
//! process): its time, its speed-up over one thread and, for decryption,
//! its time over the one-thread floor.
//! With `--gate X` it runs only the single-threaded figures and exits 1 if
//! keyfence is more than X times slower than CIRCL on any operation: a
//! ratio, so a slow or busy machine does not fail it (`./x test`).
//!
//! ```text
//! cargo run --release -p keyfence-benches --bin compare_abe -- \
//!     --keyfence target/release/keyfence --oracle target/circl-oracle \
//!     [--rounds 5] [--iters 10] [--json OUT.json] [--svg OUT.svg] [--gate 1.5]
//! cargo run --release -p keyfence-benches --bin compare_abe -- --replot IN.json --svg OUT.svg
//! ```

use std::collections::BTreeMap;
use std::process::Command;

use serde_json::Value;

const OPS: [&str; 4] = ["keygen_ms", "encrypt_ms", "decrypt_ms", "decrypt_cold_ms"];
const CASES: [&str; 4] = ["small", "and50", "or50", "and50neg25"];
/// Issue 15's targets (CIRCL time / keyfence time): keygen and encrypt
/// for every case, then decrypt per case in `CASES` order.
const TARGETS: [f64; 2] = [4.0, 5.0];
const DECRYPT_TARGETS: [f64; 4] = [3.3, 6.5, 6.5, 6.5];
/// Issue 29's target for a decryption from a cold key (loaded from bytes,
/// then one decryption; CIRCL: unmarshal, then decrypt), every case.
const COLD_TARGET: f64 = 4.0;
/// Issue 15's bounds on keyfence's decryption time over its lower bound.
const FLOOR_TARGETS: [f64; 4] = [1.1, 1.2, 1.2, 1.2];
/// Issue 29's targets for two threads over one (one-thread time /
/// two-thread time), per case in `CASES` order, for keygen, encrypt and
/// decrypt: never slower on `small`, 1.6x on the 50-attribute shapes.
const THREAD_TARGETS: [f64; 4] = [1.0, 1.6, 1.6, 1.6];
/// The operations `keyfence bench abe` also times on two threads.
const THREADED: [&str; 3] = ["keygen_ms", "encrypt_ms", "decrypt_ms"];

struct Args {
    keyfence: String,
    oracle: String,
    rounds: usize,
    iters: usize,
    json: Option<String>,
    svg: Option<String>,
    replot: Option<String>,
    gate: Option<f64>,
}

fn args() -> Args {
    let mut a = Args {
        keyfence: "target/release/keyfence".into(),
        oracle: "target/circl-oracle".into(),
        rounds: 5,
        iters: 10,
        json: None,
        svg: None,
        replot: None,
        gate: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--keyfence" => a.keyfence = val(),
            "--oracle" => a.oracle = val(),
            "--rounds" => a.rounds = val().parse().expect("--rounds"),
            "--iters" => a.iters = val().parse().expect("--iters"),
            "--json" => a.json = Some(val()),
            "--svg" => a.svg = Some(val()),
            "--replot" => a.replot = Some(val()),
            "--gate" => a.gate = Some(val().parse().expect("--gate")),
            other => panic!("unknown flag {other}"),
        }
    }
    a
}

/// Runs one bench command; returns case -> object.
fn run(cmd: &str, args: &[&str]) -> BTreeMap<String, Value> {
    let out = Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(out.status.success(), "{cmd} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("JSON line");
            (v["case"].as_str().expect("case").to_owned(), v)
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let a = args();
    // Redraw the chart from saved figures without measuring again.
    if let (Some(json), Some(out)) = (&a.replot, &a.svg) {
        let rows: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(json).expect("read json")).expect("json");
        std::fs::write(out, svg(&rows)).expect("write svg");
        return;
    }
    let iters = a.iters.to_string();
    // (implementation, case, op) -> samples (one median per round)
    let mut samples: BTreeMap<(&str, String, &str), Vec<f64>> = BTreeMap::new();
    let mut overhead: BTreeMap<(&str, String), u64> = BTreeMap::new();
    for round in 0..a.rounds {
        eprintln!("round {}/{}", round + 1, a.rounds);
        let runs = [
            ("circl", run(&a.oracle, &["bench", "--json", "--iters", &iters])),
            ("keyfence", run(&a.keyfence, &["bench", "abe", "--json", "--iters", &iters])),
        ];
        for (name, res) in runs {
            for case in CASES {
                let v = &res[case];
                for op in OPS {
                    samples.entry((name, case.into(), op)).or_default().push(v[op].as_f64().expect("ms"));
                }
                if name == "keyfence" {
                    for op in THREADED {
                        let two = v[format!("{op}_2threads")].as_f64().expect("ms on two threads");
                        samples.entry(("keyfence_2t", case.into(), op)).or_default().push(two);
                    }
                }
                if let Some(f) = v["decrypt_floor_ms"].as_f64() {
                    samples.entry((name, case.into(), "decrypt_floor_ms")).or_default().push(f);
                }
                overhead.insert((name, case.into()), v["ct_overhead"].as_u64().expect("overhead"));
            }
        }
    }
    let m = |name: &'static str, case: &str, op: &'static str| {
        samples.get(&(name, case.to_owned(), op)).map(|v| median(v.clone())).unwrap_or(f64::NAN)
    };
    println!(
        "| case | operation | CIRCL ms | keyfence ms | ratio | target | keyfence / floor \
         | 2 threads ms | ratio | 1 thread / 2 threads | 2 threads / floor |"
    );
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let mut rows = Vec::new();
    let mut failed = Vec::new();
    for (ci, case) in CASES.iter().enumerate() {
        for (oi, op) in OPS.iter().enumerate() {
            let target = match *op {
                "decrypt_ms" => DECRYPT_TARGETS[ci],
                "decrypt_cold_ms" => COLD_TARGET,
                _ => TARGETS[oi],
            };
            let c = m("circl", case, op);
            let k1 = m("keyfence", case, op);
            let k = m("keyfence_2t", case, op);
            let floor_ms = m("keyfence", case, "decrypt_floor_ms");
            let floor = if *op == "decrypt_ms" { k1 / floor_ms } else { f64::NAN };
            let floor_cell = if floor.is_nan() { String::new() } else { format!("{floor:.2} (<= {})", FLOOR_TARGETS[ci]) };
            // Two threads against one, both from the same keyfence runs;
            // for decryption also against the one-thread floor.
            let speedup = k1 / k;
            let floor2 = if *op == "decrypt_ms" { k / floor_ms } else { f64::NAN };
            let two = if k.is_nan() {
                "| | | |".to_string()
            } else {
                let f2 = if floor2.is_nan() { String::new() } else { format!("{floor2:.2}") };
                format!("| {k:.2} | {:.1}x | {speedup:.2}x (>= {}x) | {f2}", c / k, THREAD_TARGETS[ci])
            };
            println!("| {case} | {} | {c:.2} | {k1:.2} | {:.1}x | {target}x | {floor_cell} {two} |", op.trim_end_matches("_ms"), c / k1,);
            if let Some(g) = a.gate {
                if k1 > g * c {
                    failed.push(format!("{case} {op}: keyfence {k1:.2} ms, CIRCL {c:.2} ms"));
                }
            }
            rows.push(serde_json::json!({
                "case": case, "op": op.trim_end_matches("_ms"), "circl_ms": c,
                "keyfence_ms": k1, "keyfence_2threads_ms": k,
                "ratio": c / k1, "ratio_2threads": c / k, "target": target,
                "floor_ratio": if floor.is_nan() { serde_json::Value::Null } else { serde_json::json!(floor) },
                "speedup_2threads": speedup, "speedup_2threads_target": if k.is_nan() { None } else { Some(THREAD_TARGETS[ci]) },
                "floor_ratio_2threads": if floor2.is_nan() { serde_json::Value::Null } else { serde_json::json!(floor2) },
            }));
        }
        let (oc, ok) = (overhead[&("circl", case.to_string())], overhead[&("keyfence", case.to_string())]);
        println!(
            "| {case} | ciphertext overhead (bytes) | {oc} | {ok} | {} | equal | | | | | |",
            if oc == ok { "same" } else { "DIFFERENT" }
        );
        assert_eq!(oc, ok, "{case}: ciphertext sizes differ");
    }
    if let Some(g) = a.gate {
        if !failed.is_empty() {
            eprintln!("keyfence is more than {g}x slower than CIRCL on: {}", failed.join("; "));
            std::process::exit(1);
        }
        eprintln!("gate: keyfence within {g}x of CIRCL on every operation");
        return;
    }
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&rows).expect("json")).expect("write json");
    }
    if let Some(p) = &a.svg {
        std::fs::write(p, svg(&rows)).expect("write svg");
    }
}

/// A grouped bar chart of the ratios, one group per case, with each
/// operation's target marked.
fn svg(rows: &[Value]) -> String {
    let (w, h, left, bottom, top) = (760.0, 360.0, 50.0, 60.0, 40.0);
    // Figures a run did not measure (cold decryption on two threads) are
    // null in the JSON.
    let two = |r: &Value| r["ratio_2threads"].as_f64().unwrap_or(f64::NAN);
    let max = rows.iter().map(|r| r["ratio"].as_f64().unwrap().max(two(r))).filter(|v| v.is_finite()).fold(10.0, f64::max).ceil();
    let y = |v: f64| top + (h - top - bottom) * (1.0 - v / max);
    let colors = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1"];
    let mut s = format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' font-family='sans-serif' font-size='12'>\n\
         <text x='{}' y='20' text-anchor='middle' font-size='14'>keyfence speed-up over CIRCL tkn20 (CIRCL time / keyfence time; dashed: on 2 threads)</text>\n",
        w / 2.0
    );
    for t in (0..=max as usize).step_by(2) {
        let yy = y(t as f64);
        s += &format!(
            "<line x1='{left}' x2='{}' y1='{yy}' y2='{yy}' stroke='#ddd'/><text x='{}' y='{}' text-anchor='end'>{t}x</text>\n",
            w - 10.0,
            left - 5.0,
            yy + 4.0
        );
    }
    let group = (w - left - 10.0) / CASES.len() as f64;
    for (ci, case) in CASES.iter().enumerate() {
        let x0 = left + group * ci as f64 + 10.0;
        s += &format!("<text x='{}' y='{}' text-anchor='middle'>{case}</text>\n", x0 + group / 2.0 - 10.0, h - bottom + 18.0);
        for (oi, op) in ["keygen", "encrypt", "decrypt", "decrypt_cold"].iter().enumerate() {
            let r = rows.iter().find(|r| r["case"] == *case && r["op"] == *op).unwrap();
            let bw = (group - 30.0) / 4.0;
            let x = x0 + oi as f64 * bw;
            let (v, v1, t) = (r["ratio"].as_f64().unwrap(), two(r), r["target"].as_f64().unwrap());
            s += &format!("<rect x='{x}' y='{}' width='{}' height='{}' fill='{}'/>\n", y(v), bw - 4.0, y(0.0) - y(v), colors[oi]);
            if v1.is_finite() {
                s += &format!(
                    "<rect x='{x}' y='{}' width='{}' height='{}' fill='none' stroke='#333' stroke-dasharray='3,2'/>\n",
                    y(v1),
                    bw - 4.0,
                    y(0.0) - y(v1)
                );
            }
            s += &format!("<line x1='{x}' x2='{}' y1='{}' y2='{}' stroke='#c00' stroke-width='2'/>\n", x + bw - 4.0, y(t), y(t));
            s += &format!("<text x='{}' y='{}' text-anchor='middle' font-size='10'>{v:.1}</text>\n", x + bw / 2.0 - 2.0, y(v) - 3.0);
        }
    }
    for (oi, op) in ["keygen", "encrypt", "decrypt", "cold decrypt"].iter().enumerate() {
        let x = left + 10.0 + oi as f64 * 110.0;
        s += &format!(
            "<rect x='{x}' y='{}' width='12' height='12' fill='{}'/><text x='{}' y='{}'>{op}</text>\n",
            h - 25.0,
            colors[oi],
            x + 16.0,
            h - 15.0
        );
    }
    s += &format!(
        "<line x1='{}' x2='{}' y1='{}' y2='{}' stroke='#c00' stroke-width='2'/><text x='{}' y='{}'>target</text>\n",
        left + 460.0,
        left + 480.0,
        h - 19.0,
        h - 19.0,
        left + 485.0,
        h - 15.0
    );
    s += "</svg>\n";
    s
}

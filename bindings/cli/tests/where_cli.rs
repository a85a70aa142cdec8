//! `keyfence authority inventory` and `keyfence authority where` (issue
//! 61), and `authority rotate` refusing to strand machines (issue 62):
//! on a directory and on a three-member etcd cluster.

mod common;
#[path = "../../../core/tests/etcd_support/mod.rs"]
mod etcd_support;

use common::{keyfence as run, ok, stderr, stdout, Dir};

/// The JSON `where --json` printed.
fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn group<'a>(v: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    v["groups"].as_array().unwrap().iter().find(|g| g["value"] == name).unwrap_or_else(|| panic!("no group {name}: {v}"))
}

/// The seeds' outage in small: an EU-but-not-GB key, the world's traffic.
fn the_commands_on(s: &str, d: &Dir) {
    ok(&["authority", "init", "--store", s]);
    let o = ok(&["authority", "inventory", "--store", s]);
    assert!(o.contains("0 machine(s)"), "{o}");
    for (dc, region, country) in [("fra1", "EU", "DE"), ("fra1", "EU", "DE"), ("ams1", "EU", "NL"), ("lhr1", "EU", "GB")] {
        ok(&["authority", "issue", "--store", s, "--attrs", &format!("dc={dc},region={region},country={country}"), "--out", &d.p("k")]);
    }
    // A fleet issued before the inventory.
    let mut fleet = String::from("# id<TAB>attributes\n");
    for (i, (dc, region, country)) in
        [("ord1", "NA", "US"), ("ord1", "NA", "US"), ("sjc1", "NA", "US"), ("nrt1", "APAC", "JP")].iter().enumerate()
    {
        fleet.push_str(&format!("{:032x}\tdc={dc},region={region},country={country}\n", i + 1));
    }
    std::fs::write(d.p("fleet.tsv"), &fleet).unwrap();
    assert!(ok(&["authority", "inventory", "--store", s, "--import", &d.p("fleet.tsv")]).contains("4 added, 0 updated, 0 unchanged"));
    let inv = json(&ok(&["authority", "inventory", "--store", s, "--json"]));
    assert_eq!((inv["total"].as_u64(), inv["live"].as_u64()), (Some(8), Some(8)));
    let one = inv["machines"].as_array().unwrap().iter().find(|m| m["id"] == format!("{:032x}", 1)).unwrap();
    assert_eq!((one["attributes"]["dc"].as_str(), one["imported"].as_bool()), (Some("ord1"), Some(true)));

    let p = "region: EU and not country: GB";
    let v = json(&ok(&["authority", "where", "--store", s, "--policy", p, "--by", "dc", "--json"]));
    assert_eq!((v["total"].as_u64(), v["matching"].as_u64()), (Some(8), Some(3)));
    assert_eq!(v["remote_share"], serde_json::Value::Null);
    assert_eq!((group(&v, "fra1")["total"].as_u64(), group(&v, "fra1")["matching"].as_u64()), (Some(2), Some(2)));
    assert_eq!(group(&v, "lhr1")["matching"].as_u64(), Some(0));
    assert!(group(&v, "fra1").get("own_rps").is_none(), "rates only with --traffic");

    std::fs::write(d.p("traffic.csv"), "group,rps\nfra1,1000\nams1,500\nlhr1,3000\nord1,60000\nsjc1,15000\nnrt1,4000\n").unwrap();
    std::fs::write(
        d.p("latency.csv"),
        "from,to,ms\nlhr1,ams1,8\nlhr1,fra1,12\nord1,ams1,95\nord1,fra1,95\nsjc1,fra1,150\nsjc1,ams1,140\nnrt1,fra1,230\nnrt1,ams1,230\n",
    )
    .unwrap();
    let o = run(&[
        "authority",
        "where",
        "--store",
        s,
        "--policy",
        p,
        "--by",
        "dc",
        "--traffic",
        &d.p("traffic.csv"),
        "--latency",
        &d.p("latency.csv"),
        "--json",
        "--svg",
        &d.p("where.svg"),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v = json(&stdout(&o));
    // lhr1 -> ams1 (8 ms); ord1 ties at 95 ms -> ams1 (sorts first);
    // sjc1 -> ams1 (140 ms); nrt1 ties -> ams1.
    let ams = group(&v, "ams1");
    assert_eq!(ams["received_rps"].as_f64(), Some(3000.0 + 60000.0 + 15000.0 + 4000.0));
    assert_eq!(group(&v, "fra1")["received_rps"].as_f64(), Some(0.0));
    assert_eq!(group(&v, "ord1")["sends_to"], "ams1");
    assert!(ams["warning"].as_str().unwrap().contains("times its own"), "{ams}");
    assert_eq!(group(&v, "fra1")["warning"], serde_json::Value::Null);
    let total = 1000.0 + 500.0 + 3000.0 + 60000.0 + 15000.0 + 4000.0;
    assert!((v["remote_share"].as_f64().unwrap() - 82000.0 / total).abs() < 1e-9, "{v}");
    let svg = std::fs::read_to_string(d.p("where.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{svg}");
    for g in ["fra1", "ams1", "lhr1", "ord1", "sjc1", "nrt1"] {
        assert!(svg.contains(&format!(">{g}</text>")), "{g} drawn");
    }
    assert!(svg.contains("#d32f2f"), "the overloaded group is drawn red");

    // Without latencies: near by region, else the satisfying group that sorts first.
    let v = json(&ok(&[
        "authority",
        "where",
        "--store",
        s,
        "--policy",
        "region: NA or country: JP",
        "--by",
        "dc",
        "--traffic",
        &d.p("traffic.csv"),
        "--near",
        "region",
        "--json",
    ]));
    assert_eq!(group(&v, "fra1")["sends_to"], "nrt1", "no NA/JP group in EU: the first that sorts");
    // Text, and a warning ratio high enough for no warning.
    let o =
        ok(&["authority", "where", "--store", s, "--policy", p, "--by", "dc", "--traffic", &d.p("traffic.csv"), "--warn-ratio", "1000"]);
    assert!(o.contains("3 of 8 live machine(s) satisfy it") && !o.contains("warning"), "{o}");

    // Nothing satisfies it: exit 1. `wrap` under it warns and wraps.
    let o = run(&["authority", "where", "--store", s, "--policy", "region: MARS", "--by", "dc"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    std::fs::write(d.p("pem"), b"secret").unwrap();
    let o = run(&["authority", "wrap", "--store", s, "--policy", "region: MARS", "--in", &d.p("pem"), "--out", &d.p("mars.env")]);
    assert!(o.status.success() && stderr(&o).contains("no machine of the inventory (8 live) satisfies `region: MARS`"), "{}", stderr(&o));
    let o = run(&["authority", "wrap", "--store", s, "--policy", p, "--in", &d.p("pem"), "--out", &d.p("eu.env")]);
    assert!(o.status.success() && !stderr(&o).contains("warning"), "{}", stderr(&o));
    // From an envelope: its policy.
    let v = json(&ok(&["authority", "where", "--store", s, "--envelope", &d.p("eu.env"), "--json"]));
    assert_eq!((v["policy"].as_str(), v["matching"].as_u64()), (Some(p), Some(3)));

    // Bad input: file, line, field; exit 2.
    std::fs::write(d.p("bad.tsv"), format!("{:032x}\tdc=x\nnot-an-id\tdc=y\n", 9)).unwrap();
    let o = run(&["authority", "inventory", "--store", s, "--import", &d.p("bad.tsv")]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("bad.tsv, line 2, field id:"), "{}", stderr(&o));
    std::fs::write(d.p("bad.csv"), "fra1,100\nams1,lots\n").unwrap();
    let o = run(&["authority", "where", "--store", s, "--policy", p, "--by", "dc", "--traffic", &d.p("bad.csv")]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("bad.csv, line 2, field rps:"), "{}", stderr(&o));
    let o = run(&["authority", "where", "--store", s, "--policy", "region: EU)", "--by", "dc"]);
    assert_eq!(o.status.code(), Some(2));
    let o = run(&["authority", "where", "--store", s, "--policy", p, "--traffic", &d.p("traffic.csv")]);
    assert_eq!(o.status.code(), Some(2), "--traffic needs --by: {}", stderr(&o));

    // Revoked machines leave every count.
    let lhr =
        inv["machines"].as_array().unwrap().iter().find(|m| m["attributes"]["dc"] == "lhr1").unwrap()["id"].as_str().unwrap().to_owned();
    ok(&["authority", "revoke", "--store", s, "--machine", &lhr]);
    let v = json(&ok(&["authority", "where", "--store", s, "--policy", "region: EU", "--json"]));
    assert_eq!((v["total"].as_u64(), v["matching"].as_u64(), v["revoked"].as_u64()), (Some(7), Some(3), Some(1)));
    let inv = json(&ok(&["authority", "inventory", "--store", s, "--json"]));
    assert_eq!(inv["live"].as_u64(), Some(7));
}

#[test]
fn inventory_and_where_on_a_directory() {
    let d = Dir::new("where");
    the_commands_on(&d.p("store"), &d);
}

#[test]
fn inventory_and_where_on_etcd() {
    let Some(cluster) = etcd_support::Cluster::start() else { return };
    let d = Dir::new("where-etcd");
    the_commands_on(&cluster.name("cli/where"), &d);
}

/// Issue 62 item 3: the second rotation would retire generation 1, the
/// newest of every machine issued before the first: refused, naming
/// --force; forced, it warns with the machines and rotates.
#[test]
fn rotate_refuses_to_strand_issued_machines() {
    let d = Dir::new("strand");
    let s = d.p("store");
    ok(&["authority", "init", "--store", &s]);
    ok(&["authority", "issue", "--store", &s, "--attrs", "dc=fra1", "--out", &d.p("k1")]);
    assert!(ok(&["authority", "rotate", "--store", &s]).contains("nothing retired"));
    let o = run(&["authority", "rotate", "--store", &s]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("retires master generation 1") && stderr(&o).contains("--force"), "{}", stderr(&o));
    assert!(ok(&["authority", "status", "--store", &s]).contains("generation 2: active"), "nothing rotated");
    let o = run(&["authority", "rotate", "--store", &s, "--force"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("strands 1 machine(s)"), "{}", stderr(&o));
    assert!(stdout(&o).contains("generation 1 retired"), "{}", stdout(&o));
    // A machine issued now holds generations 3 and 2: the next rotation
    // retires 2, which it still has 3 beside; the first machine's newest,
    // 1, is gone already. Nobody is stranded by it.
    ok(&["authority", "issue", "--store", &s, "--attrs", "dc=fra2", "--out", &d.p("k2")]);
    assert!(ok(&["authority", "rotate", "--store", &s]).contains("generation 2 retired"));
}

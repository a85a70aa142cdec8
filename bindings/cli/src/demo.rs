//! `keyfence demo`: the end-to-end story, on real code.

use std::process::ExitCode;

use keyfence::policy::{parse, Attributes};

/// Sample data centers and the attributes their machines hold.
const FLEET: &[(&str, &str)] = &[
    ("fra1", "country=DE,region=EU"),
    ("cdg1", "country=FR,region=EU"),
    ("iad1", "country=US,region=NA"),
    ("nrt1", "country=JP,region=APAC"),
    ("lhr1", "country=GB,region=UK"),
];

/// Customer policies, in the language of the seeds.
const POLICIES: &[&str] = &[
    "region: EU",
    "country: US or (not region: EU)",
    "(region: EU or region: UK) and not country: FR",
];

pub fn run() -> anyhow::Result<ExitCode> {
    println!("keyfence demo: which data centers may hold which key\n");
    let fleet: Vec<(&str, Attributes)> = FLEET
        .iter()
        .map(|(dc, a)| Ok((*dc, a.parse()?)))
        .collect::<anyhow::Result<_>>()?;
    for src in POLICIES {
        let p = parse(src)?;
        println!("policy   {src}");
        println!("circuit  {} leaves, {} gates, canonical: {p}", p.leaves().len(), p.gates().len());
        for (dc, attrs) in &fleet {
            let verdict = if p.eval(attrs) { "may open" } else { "forwards" };
            println!("  {dc:<5} {{{attrs}}}  {verdict}");
        }
        println!();
    }
    let bad = "country: US) and region: EU";
    println!("a malformed policy is refused with its position:");
    match parse(bad) {
        Ok(_) => anyhow::bail!("malformed policy {bad:?} was accepted"),
        Err(e) => println!("{}\n", e.render(bad)),
    }
    println!("Still to come in this demo: CP-ABE encryption of policy keys (issue 4),");
    println!("wrapping of customer keys and rotation (issue 5), asynchronous signing (issues 6-7).");
    Ok(ExitCode::SUCCESS)
}

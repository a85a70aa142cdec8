//! `keyfence policy ...`.

use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use keyfence::policy::{parse, Attributes};

#[derive(Subcommand)]
pub enum PolicyCmd {
    /// Parse POLICY, print its canonical form and, with --attrs, whether
    /// those attributes satisfy it. Exits 1 on a malformed policy.
    Check {
        /// The policy text, e.g. 'country: US or (not region: EU)'.
        policy: String,
        /// Attributes to test, as label=value,label=value.
        #[arg(long)]
        attrs: Option<String>,
        /// Print one JSON object {"canonical": ..., "satisfied": ...}.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(cmd: PolicyCmd) -> anyhow::Result<ExitCode> {
    match cmd {
        PolicyCmd::Check { policy, attrs, json } => {
            let attrs: Option<Attributes> = attrs
                .map(|a| a.parse())
                .transpose()
                .context("invalid --attrs")?;
            let p = match parse(&policy) {
                Ok(p) => p,
                Err(e) => {
                    eprintln!("{}", e.render(&policy));
                    return Ok(ExitCode::from(1));
                }
            };
            let satisfied = attrs.as_ref().map(|a| p.eval(a));
            if json {
                let obj = serde_json::json!({ "canonical": p.to_string(), "satisfied": satisfied });
                println!("{obj}");
            } else {
                println!("{p}");
                if let (Some(a), Some(s)) = (&attrs, satisfied) {
                    let leaves = p.satisfying_leaves(a).unwrap_or_default();
                    if s {
                        let used: Vec<String> = leaves.iter().map(|&i| describe_leaf(&p, i)).collect();
                        println!("satisfied by {{{a}}} (using {})", used.join(", "));
                    } else {
                        println!("not satisfied by {{{a}}}");
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn describe_leaf(p: &keyfence::policy::Policy, i: usize) -> String {
    let l = &p.leaves()[i];
    format!("{}{}: {}", if l.positive { "" } else { "not " }, l.label, l.value)
}

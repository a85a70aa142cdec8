//! `keyfence policy ...`.

use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use keyfence::policy::Attributes;

use crate::abe_cmd::parse_policy;
use crate::exit;
use crate::files::outln;

#[derive(Subcommand)]
pub enum PolicyCmd {
    /// Parse POLICY, print its canonical form and, with --attrs, whether
    /// those attributes satisfy it. Exits 0 if they do (or without
    /// --attrs), 1 if they do not, 2 on a malformed policy or attribute
    /// list (docs/policy-language.md).
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
            let attrs: Option<Attributes> = attrs.map(|a| a.parse()).transpose().context("invalid --attrs")?;
            let p = parse_policy(&policy)?;
            let satisfied = attrs.as_ref().map(|a| p.eval(a));
            if json {
                let obj = serde_json::json!({ "canonical": p.to_string(), "satisfied": satisfied });
                outln!("{obj}");
            } else {
                outln!("{p}");
                if let (Some(a), Some(s)) = (&attrs, satisfied) {
                    let leaves = p.satisfying_leaves(a).unwrap_or_default();
                    if s {
                        let used: Vec<String> = leaves.iter().map(|&i| describe_leaf(&p, i)).collect();
                        outln!("satisfied by {{{a}}} (using {})", used.join(", "));
                    } else {
                        outln!("not satisfied by {{{a}}}");
                    }
                }
            }
            Ok(if satisfied == Some(false) { ExitCode::from(exit::NO) } else { ExitCode::SUCCESS })
        }
    }
}

fn describe_leaf(p: &keyfence::policy::Policy, i: usize) -> String {
    let l = &p.leaves()[i];
    format!("{}{}: {}", if l.positive { "" } else { "not " }, l.label, l.value)
}

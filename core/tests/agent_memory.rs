//! The agent's memory against an allowed local user who makes it hold
//! what it can (issue 59.2): partial frames of the largest size on
//! hundreds of connections. A test binary of its own, so that this
//! process's resident memory is the agent's (and the test's, which is
//! small and steady): the bound is measured, not only counted.

use std::path::Path;
use std::time::{Duration, Instant};

use keyfence::sign::agent::Agent;

mod common;
mod key_process_support;
use key_process_support::{agent_config, agent_world, attacker, Attacker, Dir};

/// This process's resident memory, in MiB.
fn rss_mib() -> f64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: f64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096.0 / (1 << 20) as f64
}

/// One round: `count` connections of the attacker each holding all but a
/// byte of a 1 MiB frame for `seconds`; the highest resident memory seen
/// meanwhile, the attacker's account, and what the agent counted at most.
fn round(socket: &Path, count: usize, seconds: f64, agent: &Agent) -> (f64, String, usize) {
    let a = attacker(&[
        ("KEYFENCE_ATTACK", "partial".to_string()),
        ("KEYFENCE_ATTACK_SOCKET", socket.display().to_string()),
        ("KEYFENCE_ATTACK_COUNT", count.to_string()),
        ("KEYFENCE_ATTACK_SECONDS", seconds.to_string()),
    ]);
    let (mut peak, mut counted) = (0f64, 0usize);
    let done = std::thread::scope(|s| {
        let said = s.spawn(|| a.said("ATTACK: done", Duration::from_secs(120)));
        while !said.is_finished() {
            peak = peak.max(rss_mib());
            counted = counted.max(agent.stats().memory);
            std::thread::sleep(Duration::from_millis(50));
        }
        said.join().unwrap()
    });
    (peak, done, counted)
}

/// Waits until the agent has closed every connection and given the
/// memory back (its poller trims at most once a second): the resident
/// memory then.
fn settled(agent: &Agent) -> f64 {
    let until = Instant::now() + Duration::from_secs(20);
    while agent.stats().open > 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(2500));
    rss_mib()
}

#[test]
fn one_user_cannot_make_the_agent_hold_more_than_its_share_and_memory_comes_back() {
    if common::skip_unless(common::is_root(), "running an attacker as another user needs root", common::REQUIRE_ROOT) {
        return;
    }
    let dir = Dir::new("agent-memory");
    let world = agent_world(&dir.0);
    let mut config = agent_config(&dir.0, &world);
    config.socket_mode = 0o666;
    config.allow_users = vec![65534];
    config.user_memory = 64 << 20;
    config.frame_timeout = Duration::from_secs(3);
    let agent = Agent::start(config.clone()).unwrap();
    let baseline = settled(&agent);
    let mut after = Vec::new();
    let mut peaks = Vec::new();
    for _ in 0..3 {
        // 512 frames of 1 MiB begun: 512 MiB sent, 64 MiB the user's share.
        let (peak, done, counted) = round(agent.socket(), 512, 8.0, &agent);
        assert!(counted <= 64 << 20, "the agent counted {counted} bytes for one user");
        // Most connections were refused at the bound; those held were cut
        // off at the frame deadline (8 s > 2 x 3 s).
        let (sent, cut, ended) = (Attacker::field(&done, "sent"), Attacker::field(&done, "cut"), Attacker::field(&done, "ended"));
        assert!(cut >= 400.0, "the bound refused {cut} of 512 frames ({done})");
        assert_eq!(ended, sent, "every partial frame it held was cut off at its deadline ({done})");
        peaks.push(peak - baseline);
        after.push(settled(&agent));
    }
    println!(
        "{{\"test\": \"agent_memory\", \"baseline_mib\": {baseline:.1}, \"peak_over_baseline_mib\": {peaks:?}, \"after_rounds_mib\": {after:?}}}"
    );
    // The user's 64 MiB, its connections' own (a thread and small buffers
    // each) and the allocator's slack: far below the 512 MiB sent.
    for p in &peaks {
        assert!(*p < 160.0, "the agent grew {p:.0} MiB under the attack (peaks {peaks:?})");
    }
    // Memory comes back: after each round near the start, and no growth
    // from round to round.
    assert!(after[2] - baseline < 48.0, "after the attack the agent held {:.0} MiB more than before", after[2] - baseline);
    assert!(after[2] - after[0] < 16.0, "the agent grew round by round: {after:?}");

    // The control: with a bound of 1 GiB and a long deadline the same
    // attack (256 frames) is held, and the resident memory shows it, so the
    // measurement above would have caught an agent that holds.
    drop(agent);
    let mut loose = config;
    loose.user_memory = 1 << 30;
    loose.max_memory = 1 << 30;
    loose.frame_timeout = Duration::from_secs(60);
    let agent = Agent::start(loose).unwrap();
    let start = settled(&agent);
    let (peak, done, _) = round(agent.socket(), 256, 4.0, &agent);
    assert!(Attacker::field(&done, "sent") >= 250.0, "{done}");
    assert!(peak - start > 200.0, "the control held 256 MiB yet the resident memory grew {:.0} MiB", peak - start);
}

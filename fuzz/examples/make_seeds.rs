//! Writes the seeds of the fuzz targets (`fuzz/seeds/TARGET/`) that are
//! objects keyfence makes: the store's objects, made by keyfence's own
//! authority on a memory store, key files, policies, the key server's
//! hellos, and CP-ABE keys and ciphertexts, each also cut short or edited
//! where a fuzzer is unlikely to edit it (inside nested lengths, behind a
//! hash). Run from the repository root (about two minutes; the bytes
//! differ every run, keys and times being fresh):
//!
//! ```sh
//! cargo run --release --manifest-path fuzz/Cargo.toml --target-dir target/fuzz-make-seeds --example make_seeds
//! ```
//!
//! Unedited CP-ABE keys and ciphertexts are made by `./x fuzz` itself
//! (`abe_seeds`), and the etcd answers are recorded from a real etcd
//! (`fuzz/etcd_seeds.sh`).

use std::path::Path;
use std::sync::Arc;

use keyfence::key_file::{KeyFile, KeyFilePeer, KeyLocation};
use keyfence::sign::remote::protocol as rp;
use keyfence::wrap::{Authority, MemoryStore, Store};

type Error = Box<dyn std::error::Error>;

fn write(target: &str, name: &str, bytes: &[u8]) -> Result<(), Error> {
    let dir = Path::new("fuzz/seeds").join(target);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join(name), bytes)?;
    Ok(())
}

fn get(store: &MemoryStore, key: &str) -> Result<Vec<u8>, Error> {
    Ok(store.get(key)?.ok_or_else(|| format!("the store holds no {key}"))?)
}

/// The first sealed copy in the store that starts with `magic`.
fn sealed(store: &MemoryStore, magic: &[u8]) -> Result<Vec<u8>, Error> {
    for name in store.list("sealed/")? {
        let bytes = get(store, &name)?;
        if bytes.starts_with(magic) {
            return Ok(bytes);
        }
    }
    Err(format!("no sealed copy starts with {magic:?}").into())
}

/// A reader of the little-endian, length-prefixed fields CIRCL writes.
struct Fields<'a>(&'a [u8]);

impl<'a> Fields<'a> {
    fn take(&mut self, n: usize) -> &'a [u8] {
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }
    fn u16(&mut self) -> usize {
        let b = self.take(2);
        usize::from(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> usize {
        let b = self.take(4);
        u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize
    }
    fn b16(&mut self) -> Vec<u8> {
        let n = self.u16();
        self.take(n).to_vec()
    }
    fn b32(&mut self) -> Vec<u8> {
        let n = self.u32();
        self.take(n).to_vec()
    }
}

fn b16(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u16).to_le_bytes());
    out.extend_from_slice(b);
}

fn b32(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

/// A CIRCL ciphertext (docs/abe.md, "Formats") taken apart, to be put
/// back together edited where a fuzzer cannot edit it: inside length
/// prefixes nested three deep.
#[derive(Clone)]
struct Ciphertext {
    id: Vec<u8>,
    policy: Vec<u8>,
    c1: Vec<u8>,
    c2: Vec<Vec<u8>>,
    c3: Vec<Vec<u8>>,
    c3neg: Vec<Vec<u8>>,
    envelope: Vec<u8>,
    tag: Vec<u8>,
}

impl Ciphertext {
    fn split(ct: &[u8]) -> Self {
        let mut f = Fields(ct.strip_prefix(b"v1.3.8").expect("a v1.3.8 ciphertext"));
        let id = f.b16();
        let mac = f.b32();
        let tag = f.b16();
        let mut m = Fields(&mac);
        let header = m.b32();
        let envelope = m.b32();
        let mut h = Fields(&header);
        let (policy, c1) = (h.b16(), h.b16());
        let c2 = (0..h.u16()).map(|_| h.b16()).collect();
        let n = h.u16();
        let c3 = (0..n).map(|_| h.b16()).collect();
        let c3neg = (0..n).map(|_| h.b16()).collect();
        Ciphertext { id, policy, c1, c2, c3, c3neg, envelope, tag }
    }

    /// The v1.3.8 encoding, or with `wide` false CIRCL's older one (no
    /// version, 16-bit lengths throughout).
    fn join(&self, wide: bool) -> Vec<u8> {
        let mut header = Vec::new();
        b16(&mut header, &self.policy);
        b16(&mut header, &self.c1);
        header.extend_from_slice(&(self.c2.len() as u16).to_le_bytes());
        self.c2.iter().for_each(|c| b16(&mut header, c));
        header.extend_from_slice(&(self.c3.len() as u16).to_le_bytes());
        self.c3.iter().chain(&self.c3neg).for_each(|c| b16(&mut header, c));
        let long = if wide { b32 } else { b16 };
        let mut mac = Vec::new();
        long(&mut mac, &header);
        long(&mut mac, &self.envelope);
        let mut out = if wide { b"v1.3.8".to_vec() } else { Vec::new() };
        b16(&mut out, &self.id);
        long(&mut out, &mac);
        b16(&mut out, &self.tag);
        out
    }

    /// The same with the label and value of the policy's first wire
    /// replaced (its hashed value kept).
    fn first_wire(&self, label: &[u8], value: &[u8]) -> Self {
        let mut f = Fields(&self.policy);
        let formula = f.b16();
        let n = f.u16();
        let mut wires: Vec<Vec<u8>> = (0..n).map(|_| f.b16()).collect();
        let mut w = Fields(&wires[0]);
        let (_, _, scalar, sign) = (w.b16(), w.b16(), w.b16(), w.take(1).to_vec());
        let mut first = Vec::new();
        b16(&mut first, label);
        b16(&mut first, value);
        b16(&mut first, &scalar);
        first.extend_from_slice(&sign);
        wires[0] = first;
        let mut policy = Vec::new();
        b16(&mut policy, &formula);
        policy.extend_from_slice(&(n as u16).to_le_bytes());
        wires.iter().for_each(|w| b16(&mut policy, w));
        Ciphertext { policy, ..self.clone() }
    }
}

/// CP-ABE keys and ciphertexts made by keyfence, each edited where only a
/// forger would: the identity of each group, a Gt coefficient past the
/// field's modulus, and ciphertext headers whose shape does not match
/// their policy. The unedited ones come from `./x fuzz` itself (abe_seeds).
fn abe() -> Result<(), Error> {
    let (pk, msk) = keyfence::abe::setup()?;
    // The master key's last field, its PRF key (16 bytes), made 65 long.
    let msk = msk.to_bytes();
    let mut long = msk[..msk.len() - 18].to_vec();
    b16(&mut long, &[7; 65]);
    write("abe_parse_keys", "msk_long_prf_key", &long)?;
    let pk = pk.to_bytes();
    // b2 (4x2 G2), wb1 (3x2 G1), btk (2x1 Gt), each a u16-prefixed matrix
    // whose rows and columns (u16 each) come first.
    let (g2, g1, gt) = (2 + 4, 2 + 4 + 8 * 192 + 2 + 4, 2 + 4 + 8 * 192 + 2 + 4 + 6 * 96 + 2 + 4);
    let edited = |at: usize, with: &[u8]| {
        let mut k = pk.clone();
        k[at..at + with.len()].copy_from_slice(with);
        k
    };
    // The identity, uncompressed: the infinity flag and zeros.
    let infinity = |len: usize| [&[0x40][..], &vec![0; len - 1]].concat();
    write("abe_parse_keys", "pk_g2_identity", &edited(g2, &infinity(192)))?;
    write("abe_parse_keys", "pk_g1_identity", &edited(g1, &infinity(96)))?;
    write("abe_parse_keys", "pk_gt_past_modulus", &edited(gt, &[0xff; 48]))?;
    let mut one = vec![0; 576];
    one[575] = 1;
    write("abe_parse_keys", "pk_gt_identity", &edited(gt, &one))?;

    let (pk, _) = keyfence::abe::setup()?;
    let ct = Ciphertext::split(&keyfence::abe::encrypt(&pk, "(region: EU or region: UK) and not country: FR", b"seed")?);
    write("abe_parse_ciphertext", "v1.3.7", &ct.join(false))?;
    let short = Ciphertext { envelope: ct.envelope[..10].to_vec(), ..ct.clone() };
    write("abe_parse_ciphertext", "short_envelope", &short.join(true))?;
    let (mut c3, mut c3neg) = (ct.c3.clone(), ct.c3neg.clone());
    c3.pop();
    c3neg.pop();
    write("abe_parse_ciphertext", "c3_count", &Ciphertext { c3, c3neg, ..ct.clone() }.join(true))?;
    let c2 = [ct.c2.clone(), ct.c2.clone()].concat();
    write("abe_parse_ciphertext", "c2_count", &Ciphertext { c2, ..ct.clone() }.join(true))?;
    let mut c3neg = ct.c3neg.clone();
    *c3neg.last_mut().ok_or("no c3neg")? = ct.c3[0].clone();
    write("abe_parse_ciphertext", "c3neg_for_bk_wire", &Ciphertext { c3neg, ..ct.clone() }.join(true))?;
    // Wire 0 (`region: EU`) is positive.
    let mut c3neg = ct.c3neg.clone();
    c3neg[0] = ct.c3[0].clone();
    write("abe_parse_ciphertext", "c3neg_for_positive_wire", &Ciphertext { c3neg, ..ct.clone() }.join(true))?;
    // The formula's length, its gate count, then gate 0's class.
    let mut policy = ct.policy.clone();
    policy[4] = 2;
    write("abe_parse_ciphertext", "unknown_gate_class", &Ciphertext { policy, ..ct.clone() }.join(true))?;
    write("abe_parse_ciphertext", "empty_label", &ct.first_wire(b"", b"EU").join(true))?;
    write("abe_parse_ciphertext", "empty_value", &ct.first_wire(b"region", b"").join(true))?;
    write("abe_parse_ciphertext", "bk_label", &ct.first_wire(b"internal-boneh-katz-transform-attribute", b"EU").join(true))?;
    // abe_decrypt reads edits (position, byte to XOR in) of its own
    // ciphertext: none, which must decrypt (its `identity` seed, a lone
    // even byte, cuts the ciphertext to nothing), and one bit flipped.
    write("abe_decrypt", "no_edit", &[0, 0, 0])?;
    write("abe_decrypt", "one_flip", &[0x10, 0, 1])?;
    Ok(())
}

/// The store's objects: envelopes and machine keys (wrap_parse), sealed
/// copies (wrap_sealed), generation and revocation lists (wrap_lists);
/// returns an envelope.
fn store_objects() -> Result<Vec<u8>, Error> {
    let store = Arc::new(MemoryStore::default());
    let mut authority = Authority::init(store.clone())?;
    let env = authority.wrap("region: EU and not country: FR", b"-----BEGIN PRIVATE KEY-----\n...")?;
    let fra = authority.issue(&"region=EU,country=DE".parse()?)?;
    let ams = authority.issue(&"region=EU,country=NL".parse()?)?;
    write("wrap_parse", "envelope", env.to_bytes())?;
    write("wrap_parse", "machine_key", &fra.to_bytes())?;
    // Its attribute key's `machine` labels renamed past `region`, so they
    // come out of order (a second encoding of one key, until the reader
    // refused it).
    let mut renamed = fra.to_bytes().to_vec();
    let label = b"\x07\x00machine";
    let at: Vec<usize> = (0..renamed.len()).filter(|&i| renamed[i..].starts_with(label)).collect();
    for &i in &at[1..] {
        renamed[i + 2..i + 9].copy_from_slice(b"regione");
    }
    write("wrap_parse", "machine_key_labels_out_of_order", &renamed)?;
    // An envelope whose policy is not in canonical form (parentheses the
    // canonical text leaves out) under that text's own id: the id cannot
    // be forged by a fuzzer, so it comes made.
    let text = "(region: EU) and not country: FR";
    let bytes = env.to_bytes();
    let (head, tail) = (&bytes[..4 + 2 + 32 + 16], &bytes[4 + 2 + 32 + 16 + 32 + 4..]);
    let old = usize::from(u16::from_le_bytes([tail[0], tail[1]]));
    let mut odd = head.to_vec();
    odd.extend_from_slice(&keyfence::wrap::policy_id(text));
    odd.extend_from_slice(&bytes[4 + 2 + 32 + 16 + 32..4 + 2 + 32 + 16 + 32 + 4]);
    odd.extend_from_slice(&u16::try_from(text.len())?.to_le_bytes());
    odd.extend_from_slice(text.as_bytes());
    odd.extend_from_slice(&tail[2 + old..]);
    write("wrap_parse", "envelope_policy_not_canonical", &odd)?;

    let kfp2 = sealed(&store, b"KFP2")?;
    let g1 = get(&store, "public/generations")?;
    authority.rotate_master()?;
    let g2 = get(&store, "public/generations")?;
    authority.revoke(fra.id().ok_or("no machine id")?)?;
    let r1 = get(&store, "public/revoked")?;
    authority.revoke(ams.id().ok_or("no machine id")?)?;
    let r2 = get(&store, "public/revoked")?;
    let kfp3 = sealed(&store, b"KFP3")?;
    authority.rotate_master()?;
    let g3 = get(&store, "public/generations")?;

    // Sealed copies: whole, cut inside the excluded ids, a KFP3 made to
    // exclude nobody, and a KFP2 read as KFP3.
    write("wrap_sealed", "kfp2", &kfp2)?;
    write("wrap_sealed", "kfp3", &kfp3)?;
    let ids_at = 4 + 2 + 32 + 32 + 4 + 4 + 2 + usize::from(u16::from_le_bytes([kfp3[78], kfp3[79]]));
    write("wrap_sealed", "kfp3_cut", &kfp3[..ids_at + 5])?;
    let mut none = kfp3[..ids_at].to_vec();
    none.extend_from_slice(&[0, 0]);
    write("wrap_sealed", "kfp3_excludes_none", &none)?;
    let mut relabelled = kfp2.clone();
    relabelled[3] = b'3';
    write("wrap_sealed", "kfp2_as_kfp3", &relabelled)?;

    // Lists, one at a time and as the store served them in turn (forward,
    // and put back); an unknown state, out-of-order generations, the
    // unsigned text list of old versions.
    for (name, bytes) in [("g1", &g1), ("g2", &g2), ("g3", &g3), ("r1", &r1), ("r2", &r2)] {
        write("wrap_lists", name, bytes)?;
    }
    write("wrap_lists", "g1_g2_g3", &[&g1[..], &g2, &g3].concat())?;
    write("wrap_lists", "g3_g2", &[&g3[..], &g2].concat())?;
    write("wrap_lists", "r1_r2_r1", &[&r1[..], &r2, &r1].concat())?;
    let entries = 4 + 32 + 8 + 2;
    let mut unknown = g2.clone();
    unknown[entries + 4] = 9;
    write("wrap_lists", "g2_unknown_state", &unknown)?;
    let mut swapped = g2.clone();
    swapped[entries..entries + 10].copy_from_slice(&[&g2[entries + 5..entries + 10], &g2[entries..entries + 5]].concat());
    write("wrap_lists", "g2_out_of_order", &swapped)?;
    write("wrap_lists", "g2_cut", &g2[..entries + 3])?;
    write("wrap_lists", "unsigned_text", b"1 1\n2 0\n")?;

    Ok(env.to_bytes().to_vec())
}

fn policies() -> Result<(), Error> {
    // Quoted words with every escape, as written and in the canonical form
    // the code writes; and the lexer's and the parser's refusals.
    let quoted = r#"name: "caf\u{e9} \"au\" \\lait" and not "a b": "x\u{1b}y" or tier: 1"#;
    write("policy_parse", "quoted", quoted.as_bytes())?;
    write("policy_parse", "quoted_canonical", keyfence::policy::parse(quoted)?.to_string().as_bytes())?;
    // Past the parser's limits: 65 groups deep, 1311 terms.
    write("policy_parse", "too_deep", format!("{}a: b{}", "(".repeat(65), ")".repeat(65)).as_bytes())?;
    write("policy_parse", "too_many_terms", vec!["a:b"; 1311].join(" or ").as_bytes())?;
    for (name, bad) in [
        ("not_nfc", r#"a: "e\u{301}""#),
        ("bad_escape", r#"a: "\q""#),
        ("bad_unicode_escape", r#"a: "\u{d800}" or b: "\u{}" or c: "\u{1234567}""#),
        ("unterminated", r#"a: "abc"#),
        ("empty_word", r#"a: """#),
    ] {
        write("policy_parse", name, bad.as_bytes())?;
    }
    Ok(())
}

fn key_files(envelope: &[u8]) -> Result<(), Error> {
    // Key files: local with and without names, remote with two peers (one
    // with a server name), an agent's (version 2), and a few the reader
    // refuses.
    let public_key = b"0Y0\x13\x06\x07*\x86H\xce=\x02\x01".to_vec();
    let local = |store: Option<&str>, machine_key: Option<&str>| KeyFile {
        location: KeyLocation::Local { store: store.map(Into::into), machine_key: machine_key.map(Into::into) },
        public_key: public_key.clone(),
        envelope: envelope[..200].to_vec(),
    };
    let peer = |name: &str, server_name: Option<&str>| KeyFilePeer {
        name: name.into(),
        addr: "127.0.0.1:9000".into(),
        attrs: "region=EU".into(),
        server_name: server_name.map(Into::into),
    };
    let remote = KeyFile {
        location: KeyLocation::Remote {
            tls_cert: "/etc/kf/client.crt".into(),
            tls_key: "/etc/kf/client.key".into(),
            tls_ca: "/etc/kf/ca.crt".into(),
            peers: vec![peer("ks1", None), peer("ks2", Some("ks.example"))],
        },
        public_key: public_key.clone(),
        envelope: vec![7; 16],
    };
    let full = local(Some("etcd://127.0.0.1:2379/kf"), Some("/etc/kf/machine.key")).to_bytes()?;
    write("key_file", "local", &full)?;
    write("key_file", "local_bare", &local(None, None).to_bytes()?)?;
    let remote = remote.to_bytes()?;
    write("key_file", "remote", &remote)?;
    write("key_file", "remote_cut", &remote[..remote.len() - 10])?;
    // One peer more than a file may name (the writer refuses to make it).
    let peer = [&[9u8, 0, 0, 0, 5][..], b"a\0b\0c"].concat();
    write("key_file", "remote_17_peers", &[remote.clone(), peer.repeat(15)].concat())?;
    let mut twice = full.clone();
    twice.extend_from_slice(&full[6..12]);
    write("key_file", "local_mode_twice", &twice)?;
    let mut v3 = full.clone();
    v3[5] = 3;
    write("key_file", "version_3", &v3)?;
    let agent = KeyFile {
        location: KeyLocation::Agent { socket: "/run/keyfence/agent.sock".into() },
        public_key: public_key.clone(),
        envelope: vec![7; 16],
    }
    .to_bytes()?;
    write("key_file", "agent", &agent)?;
    let mut agent_v1 = agent.clone();
    agent_v1[5] = 1;
    write("key_file", "agent_in_version_1", &agent_v1)?;
    // Another mode's field in an agent's file, and an agent's socket in a
    // local file.
    let store = [&[4u8, 0, 0, 0, 2][..], b"/s"].concat();
    write("key_file", "agent_with_store", &[agent.clone(), store].concat())?;
    write("key_file", "agent_with_peer", &[agent.clone(), peer].concat())?;
    let socket = [&[10u8, 0, 0, 0, 2][..], b"/a"].concat();
    let mut local_v2 = full.clone();
    local_v2[5] = 2;
    write("key_file", "local_with_agent_socket", &[local_v2, socket].concat())?;

    Ok(())
}

fn hellos() -> Result<(), Error> {
    // The key server's hellos, for remote_frames: the client's, the
    // server's, and one of another version.
    let mut stream = vec![7];
    rp::encode(&mut stream, rp::kind::HELLO, 0, &[&rp::hello_request()[..]]);
    rp::encode(&mut stream, rp::kind::HELLO, 0, &[&rp::hello_reply(64)[..]]);
    let mut v9 = rp::hello_reply(64);
    v9[5] = 9;
    rp::encode(&mut stream, rp::kind::HELLO, 0, &[&v9[..]]);
    write("remote_frames", "hellos", &stream)?;
    Ok(())
}

fn main() -> Result<(), Error> {
    abe()?;
    let envelope = store_objects()?;
    policies()?;
    key_files(&envelope)?;
    hellos()
}

//! `keyfence agent status`: an agent's answer to "are you well?", asked
//! over its own socket as any allowed client asks (so it also proves that
//! the asking user may connect), as JSON: its pid, socket and store, its
//! machine key's standing (id, generations held and live, revoked, the
//! problem in words), keys loaded, requests in flight, connections and
//! users, memory held and what it signs with.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::sign::key_process::protocol::{self as p, kind};
use crate::sign::types::{Resource, SignError};

/// An agent's status ([`status`]).
#[derive(Debug, Clone, PartialEq)]
pub struct AgentStatus {
    /// The agent's process id.
    pub pid: u32,
    /// Everything it reported, as it sent it.
    pub json: serde_json::Value,
}

impl AgentStatus {
    /// Why the agent cannot open envelopes (its machine key revoked or
    /// holding no live generation, or its store unreadable); `None` when
    /// it can, or serves token keys only.
    pub fn problem(&self) -> Option<&str> {
        self.json.get("machine")?.get("problem")?.as_str()
    }

    /// Whether the agent can do its job: [`AgentStatus::problem`] is `None`.
    pub fn healthy(&self) -> bool {
        self.problem().is_none()
    }
}

/// Asks the agent on `socket` for its status, within `timeout`.
///
/// # Errors
/// [`SignError::Io`] when the socket cannot be reached (no agent, or this
/// user may not connect: the agent closes the connection after its
/// refusal, which is returned as [`SignError::InvalidArgument`]),
/// [`SignError::TimedOut`] when it does not answer in time, and
/// [`SignError::Io`] for an answer that is not a status.
pub fn status(socket: &Path, timeout: Duration) -> Result<AgentStatus, SignError> {
    let deadline = Instant::now() + timeout;
    let io = |e: std::io::Error| {
        if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) {
            SignError::TimedOut { timeout }
        } else {
            SignError::io(Resource::Socket, format!("{}: {e}", socket.display()))
        }
    };
    let mut stream = UnixStream::connect(socket).map_err(io)?;
    let mut out = Vec::new();
    p::encode(&mut out, kind::HELLO, 0, &[&p::hello_request(1)]);
    p::encode(&mut out, kind::AGENT_STATUS, 1, &[]);
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    stream.write_all(&out).map_err(io)?;
    let mut decoder = p::Decoder::new();
    let mut buf = [0u8; 16 * 1024];
    let mut pid = 0;
    loop {
        while let Some(frame) = decoder.next_frame().map_err(|e| SignError::io(Resource::Socket, format!("the agent's reply: {e}")))? {
            match (frame.kind, frame.id) {
                (kind::HELLO, _) => {
                    pid = p::parse_hello_reply(&frame.body)
                        .map_err(|e| SignError::io(Resource::Socket, format!("the agent's hello: {e}")))?
                        .0;
                }
                (kind::OK, 1) => {
                    let json = serde_json::from_slice(&frame.body)
                        .map_err(|e| SignError::io(Resource::Socket, format!("the agent's status is not JSON: {e}")))?;
                    return Ok(AgentStatus { pid, json });
                }
                (kind::ERR, _) => {
                    let (code, message) = p::parse_error(&frame.body);
                    return Err(SignError::InvalidArgument(format!("the agent refused: {message} ({code:?})")));
                }
                _ => {}
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(SignError::TimedOut { timeout });
        }
        stream.set_read_timeout(Some(left)).map_err(io)?;
        let n = stream.read(&mut buf).map_err(io)?;
        if n == 0 {
            return Err(SignError::io(Resource::Socket, format!("{}: the agent closed the connection without a status", socket.display())));
        }
        decoder.push(&buf[..n]);
    }
}

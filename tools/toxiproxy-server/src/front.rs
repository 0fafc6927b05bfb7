//! The public listener of one proxy: accepts clients and pipes each to the proxy's internal
//! noxious listener, applying the toxics noxious lacks or gets wrong:
//! - `reset_peer` (not in noxious): once its timeout has passed, the client socket is closed
//!   with a TCP RST (SO_LINGER 0);
//! - `bandwidth` (noxious 1.0.4 panics on chunks over ~100 x rate bytes): each direction is
//!   paced to `rate` KB/s (1 KB = 1000 bytes, as Toxiproxy).

use serde_json::{json, Value};
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// What a toxic applied here does.
#[derive(Debug, Clone, Copy)]
pub enum FrontKind {
    /// Reset connections `timeout` milliseconds after the toxic applies (0: at once).
    ResetPeer { timeout: u64 },
    /// Pace the toxic's stream to `rate` KB/s (0: unlimited).
    Bandwidth { rate: u64 },
}

/// A toxic applied by the front, with Toxiproxy's fields.
#[derive(Debug, Clone)]
pub struct FrontToxic {
    pub name: String,
    pub stream: String,
    pub toxicity: f32,
    pub kind: FrontKind,
}

/// The toxics a proxy's front applies, shared with its connections.
pub type FrontToxics = watch::Receiver<Vec<FrontToxic>>;

impl FrontToxic {
    /// Parse the kinds handled here from a normalised Toxiproxy toxic body; None for others.
    pub fn parse(body: &serde_json::Map<String, Value>) -> Option<Self> {
        let attribute = |key: &str| body.get("attributes").and_then(|a| a.get(key)).and_then(Value::as_u64);
        let kind = match body.get("type").and_then(Value::as_str)? {
            "reset_peer" => FrontKind::ResetPeer { timeout: attribute("timeout").unwrap_or(0) },
            "bandwidth" => FrontKind::Bandwidth { rate: attribute("rate").unwrap_or(0) },
            _ => return None,
        };
        let text = |key: &str| body.get(key).and_then(Value::as_str).unwrap_or("").to_owned();
        let toxicity = body.get("toxicity").and_then(Value::as_f64).unwrap_or(1.0) as f32;
        Some(FrontToxic { name: text("name"), stream: text("stream"), toxicity, kind })
    }

    /// The toxic as Toxiproxy returns it from the toxics endpoints.
    pub fn to_json(&self) -> Value {
        let (kind, attributes) = match self.kind {
            FrontKind::ResetPeer { timeout } => ("reset_peer", json!({"timeout": timeout})),
            FrontKind::Bandwidth { rate } => ("bandwidth", json!({"rate": rate})),
        };
        json!({
            "name": self.name, "type": kind, "stream": self.stream,
            "toxicity": self.toxicity, "attributes": attributes,
        })
    }
}

/// Accept clients on `listener` forever, piping each to `internal`; dropping the task (abort)
/// closes the listener and every connection it accepted.
pub async fn serve(listener: TcpListener, internal: SocketAddr, toxics: FrontToxics) {
    let mut conns = JoinSet::new();
    loop {
        match listener.accept().await {
            Ok((client, _)) => {
                conns.spawn(pipe(client, internal, toxics.clone()));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
        while conns.try_join_next().is_some() {}
    }
}

async fn pipe(mut client: TcpStream, internal: SocketAddr, toxics: FrontToxics) {
    let Ok(mut upstream) = TcpStream::connect(internal).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let reset_now = {
        let (client_read, client_write) = client.split();
        let (upstream_read, upstream_write) = upstream.split();
        let both = async {
            tokio::try_join!(
                pump(client_read, upstream_write, toxics.clone(), "upstream"),
                pump(upstream_read, client_write, toxics.clone(), "downstream"),
            )
        };
        tokio::select! {
            biased; // a reset due now comes before any byte is piped
            () = reset_deadline(toxics.clone()) => true,
            _ = both => false,
        }
    };
    if reset_now {
        let _ = client.set_zero_linger();
    }
}

/// Copy `from` to `to` until end of stream (then shut `to` down), paced by any bandwidth toxic
/// on `stream` (checked per chunk, so changes apply at once).
async fn pump(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    toxics: FrontToxics,
    stream: &str,
) -> std::io::Result<()> {
    let mut buffer = vec![0u8; 32 * 1024];
    loop {
        let read = from.read(&mut buffer).await?;
        if read == 0 {
            return to.shutdown().await;
        }
        let rate = toxics.borrow().iter().find_map(|t| match t.kind {
            FrontKind::Bandwidth { rate } if rate > 0 && t.stream == stream && roll(t.toxicity) => Some(rate),
            _ => None,
        });
        match rate {
            None => to.write_all(&buffer[..read]).await?,
            Some(rate) => {
                // At most 100 ms worth of data per write, each after its share of the time.
                let piece = usize::try_from(rate * 100).unwrap_or(usize::MAX).max(1);
                for part in buffer[..read].chunks(piece) {
                    tokio::time::sleep(Duration::from_micros(part.len() as u64 * 1000 / rate)).await;
                    to.write_all(part).await?;
                }
            }
        }
    }
}

/// Resolves when an active `reset_peer` toxic (rolled against its toxicity once per change of
/// the toxics) has waited out its timeout — at once, on its first poll, for timeout 0, so a
/// connection accepted under it passes no data (as Toxiproxy); re-armed whenever the toxics change.
async fn reset_deadline(mut toxics: FrontToxics) {
    loop {
        let timeout = toxics.borrow_and_update().iter().find_map(|t| match t.kind {
            FrontKind::ResetPeer { timeout } if roll(t.toxicity) => Some(timeout),
            _ => None,
        });
        let changed = match timeout {
            Some(0) => return,
            Some(ms) => tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(ms)) => return,
                changed = toxics.changed() => changed,
            },
            None => toxics.changed().await,
        };
        if changed.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

fn roll(toxicity: f32) -> bool {
    if toxicity >= 1.0 {
        return true;
    }
    let random = RandomState::new().build_hasher().finish() as f64 / u64::MAX as f64;
    random < f64::from(toxicity)
}

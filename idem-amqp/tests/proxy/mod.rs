//! A TCP proxy in front of RabbitMQ that can swallow what the broker sends to the first
//! connection it carried, while the connection stays up and the client's frames still
//! reach the broker:
//!
//! - its deliveries only (heartbeats and replies pass): the broker counts them as
//!   delivered and unacked, the client never sees them. What a quorum queue does to a
//!   consumer when it counts deliveries as made that never reached it;
//! - everything: a connection gone silent in one direction (a middlebox dropping a
//!   flow's packets).
//!
//! It can also cut the first connection: both sockets closed at once, what the client
//! sees of a broker node that died.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use idem::amqp::lapin::uri::AMQPUri;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// AMQP's frame types and the end-of-frame octet.
const METHOD: u8 = 1;
const FRAME_END: u8 = 0xCE;
/// `basic.deliver`: class 60, method 60.
const BASIC_DELIVER: [u8; 4] = [0, 60, 0, 60];

/// The proxy, listening on a port of its own.
pub struct Swallowing {
    url: String,
    switch: Switch,
}

/// What the proxy swallows of the first connection, and how many frames it swallowed.
#[derive(Clone, Default)]
struct Switch {
    deliveries: Arc<AtomicBool>,
    everything: Arc<AtomicBool>,
    swallowed: Arc<AtomicU64>,
    cut: Arc<tokio::sync::Notify>,
}

impl Swallowing {
    /// A proxy to the broker at `broker_url` (`amqp://user:pass@host:port/vhost`).
    pub async fn start(broker_url: &str) -> Self {
        let uri: AMQPUri = broker_url.parse().expect("an AMQP URL");
        let upstream = format!("{}:{}", uri.authority.host, uri.authority.port);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let here = listener.local_addr().unwrap().to_string();
        let url = broker_url.replacen(&upstream, &here, 1);
        assert_ne!(url, broker_url, "the URL names its host and port: {broker_url}");
        let switch = Switch::default();
        let carried = Arc::new(AtomicUsize::new(0));
        let first_switch = switch.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let first = carried.fetch_add(1, Ordering::SeqCst) == 0;
                let (upstream, switch) = (upstream.clone(), first.then(|| first_switch.clone()));
                tokio::spawn(async move {
                    let Ok(broker) = TcpStream::connect(&upstream).await else {
                        return;
                    };
                    carry(client, broker, switch).await;
                });
            }
        });
        Swallowing { url, switch }
    }

    /// The URL that reaches the broker through the proxy.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// From now on, swallow every delivery to the first connection.
    pub fn swallow_deliveries(&self) {
        self.switch.deliveries.store(true, Ordering::SeqCst);
    }

    /// From now on, swallow everything the broker sends to the first connection.
    pub fn swallow_everything(&self) {
        self.switch.everything.store(true, Ordering::SeqCst);
    }

    /// Close the first connection's two sockets now.
    pub fn cut(&self) {
        self.switch.cut.notify_one();
    }

    /// How many frames were swallowed: every one when swallowing everything; one per
    /// delivery when swallowing deliveries (its content frames not counted).
    pub fn swallowed(&self) -> u64 {
        self.switch.swallowed.load(Ordering::SeqCst)
    }
}

/// Carry one connection both ways until either side closes (or the first connection
/// is cut); the broker's frames one by one, swallowed as the first connection's
/// `swallow` says.
async fn carry(client: TcpStream, broker: TcpStream, swallow: Option<Switch>) {
    let (mut from_client, to_client) = client.into_split();
    let (from_broker, mut to_broker) = broker.into_split();
    let cut = swallow.as_ref().map(|switch| switch.cut.clone());
    let cut = async {
        match cut {
            Some(cut) => cut.notified().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::io::copy(&mut from_client, &mut to_broker) => {}
        _ = downward(from_broker, to_client, swallow) => {}
        () = cut => {}
    }
}

/// The broker's frames to the client.
async fn downward(
    mut from_broker: tokio::net::tcp::OwnedReadHalf,
    mut to_client: tokio::net::tcp::OwnedWriteHalf,
    swallow: Option<Switch>,
) -> std::io::Result<()> {
    // The channels whose delivery is being swallowed: its content frames follow it.
    let mut swallowing: HashSet<u16> = HashSet::new();
    loop {
        let mut header = [0u8; 7];
        from_broker.read_exact(&mut header).await?;
        let channel = u16::from_be_bytes([header[1], header[2]]);
        let size = u32::from_be_bytes([header[3], header[4], header[5], header[6]]) as usize;
        let mut rest = vec![0u8; size + 1];
        from_broker.read_exact(&mut rest).await?;
        assert_eq!(rest[size], FRAME_END, "a frame ends with 0xCE");
        let dropped = match (header[0], &swallow) {
            (_, None) => false,
            (_, Some(switch)) if switch.everything.load(Ordering::SeqCst) => {
                switch.swallowed.fetch_add(1, Ordering::SeqCst);
                true
            }
            (METHOD, Some(switch)) => {
                swallowing.remove(&channel);
                let deliver = rest.starts_with(&BASIC_DELIVER) && switch.deliveries.load(Ordering::SeqCst);
                if deliver {
                    swallowing.insert(channel);
                    switch.swallowed.fetch_add(1, Ordering::SeqCst);
                }
                deliver
            }
            // A content header or body frame: the delivery's, if it was swallowed.
            _ => swallowing.contains(&channel),
        };
        if !dropped {
            to_client.write_all(&header).await?;
            to_client.write_all(&rest).await?;
        }
    }
}

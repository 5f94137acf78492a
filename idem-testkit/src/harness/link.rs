//! A TCP link between a worker and its store that a test can cut: a partition.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A proxy on 127.0.0.1 in front of a store's port. While [`cut`](Self::cut), live
/// connections go silent (bytes are dropped, nothing is closed) and new ones are
/// accepted and never answered — a partition as a firewall makes one;
/// [`heal`](Self::heal) closes the silenced connections (as a NAT would forget them),
/// and new ones go through again. It also counts [round trips](Self::round_trips).
#[derive(Debug, Clone)]
pub struct Link {
    port: u16,
    cut: Arc<AtomicBool>,
    generation: watch::Sender<u64>,
    round_trips: Arc<AtomicU64>,
}

impl Link {
    /// A link to `target` (a port on 127.0.0.1), on a port of its own.
    pub async fn to(target: u16) -> Link {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (generation, _) = watch::channel(0);
        let link = Link {
            port,
            cut: Arc::default(),
            generation,
            round_trips: Arc::default(),
        };
        let serving = link.clone();
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let link = serving.clone();
                tokio::spawn(async move { link.carry(client, target).await });
            }
        });
        link
    }

    /// The port workers connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// How many round trips went through the link so far, on all its connections: a
    /// round trip is the client speaking after the server did (or first), however many
    /// packets either side's turn takes. Read it around one call on a pool of one
    /// connection to see how many round trips the call took.
    pub fn round_trips(&self) -> u64 {
        self.round_trips.load(Ordering::SeqCst)
    }

    /// Partition: silence every connection until [`heal`](Self::heal).
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }

    /// End the partition: the silenced connections close, new ones go through.
    pub fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }

    /// Carry bytes both ways until either side closes, counting round trips.
    async fn relay(&self, client: &mut TcpStream, server: &mut TcpStream) {
        let (mut from_client, mut to_client) = client.split();
        let (mut from_server, mut to_server) = server.split();
        let (mut asked, mut answered) = (vec![0; 16 * 1024], vec![0; 16 * 1024]);
        // Whether the server spoke last: the client's next bytes start a round trip.
        let mut server_spoke = true;
        loop {
            tokio::select! {
                read = from_client.read(&mut asked) => {
                    let Ok(n @ 1..) = read else { return };
                    if std::mem::replace(&mut server_spoke, false) {
                        self.round_trips.fetch_add(1, Ordering::SeqCst);
                    }
                    if to_server.write_all(&asked[..n]).await.is_err() {
                        return;
                    }
                }
                read = from_server.read(&mut answered) => {
                    let Ok(n @ 1..) = read else { return };
                    server_spoke = true;
                    if to_client.write_all(&answered[..n]).await.is_err() {
                        return;
                    }
                }
            }
        }
    }

    async fn carry(&self, mut client: TcpStream, target: u16) {
        let mut changes = self.generation.subscribe();
        if !self.cut.load(Ordering::SeqCst) {
            let Ok(mut server) = TcpStream::connect(("127.0.0.1", target)).await else {
                return;
            };
            tokio::select! {
                () = self.relay(&mut client, &mut server) => return,
                _ = changes.changed() => {}
            }
            // Cut: the server side is dropped; the client hears nothing more.
            drop(server);
        }
        // Silent until healed, then closed.
        while self.cut.load(Ordering::SeqCst) {
            if changes.changed().await.is_err() {
                break;
            }
        }
        drop(client);
    }
}

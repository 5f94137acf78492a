//! A TCP link between a worker and its store that a test can cut: a partition.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A proxy on 127.0.0.1 in front of a store's port. While [`cut`](Self::cut), live
/// connections go silent (bytes are dropped, nothing is closed) and new ones are
/// accepted and never answered — a partition as a firewall makes one;
/// [`heal`](Self::heal) closes the silenced connections (as a NAT would forget them),
/// and new ones go through again.
#[derive(Debug, Clone)]
pub struct Link {
    port: u16,
    cut: Arc<AtomicBool>,
    generation: watch::Sender<u64>,
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

    async fn carry(&self, mut client: TcpStream, target: u16) {
        let mut changes = self.generation.subscribe();
        if !self.cut.load(Ordering::SeqCst) {
            let Ok(mut server) = TcpStream::connect(("127.0.0.1", target)).await else {
                return;
            };
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut client, &mut server) => return,
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

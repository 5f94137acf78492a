//! Idempotent NATS JetStream consumers over idem's stores (in progress).

//! The body of a response through the layer: the handler's own, passed on as it
//! comes; a buffered or replayed one; or a stream passed on frame by frame while a copy
//! is kept, up to a limit, for the record.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::oneshot;

/// Errors of bodies, as tower passes them around.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A body through the layer, either way: the response
/// [`IdempotencyService`](crate::IdempotencyService) answers with — the inner service's
/// body `B` as it comes, or bytes the layer holds (a recorded response, a replay, a
/// problem document) — and the request it hands the inner service: the client's body
/// `B` untouched where the layer does not guard the request, else the bytes it read to
/// fingerprint them. axum's routes and tonic's `Routes` take any such body.
pub struct IdempotencyBody<B> {
    kind: Kind<B>,
}

enum Kind<B> {
    /// Bytes, then trailers (gRPC's status), each given once.
    Full(Option<Bytes>, Option<HeaderMap>),
    Passed(Pin<Box<B>>),
    Teed(Tee<B>),
}

/// What a teed stream left for the record when it ended.
#[derive(Debug)]
pub(crate) enum Kept {
    /// The whole body, within the limit, and its trailers.
    Whole(Bytes, Option<HeaderMap>),
    /// The body grew past the limit, failed, or the client went away before its end:
    /// it was (partly) sent and not kept.
    NotKept(&'static str),
}

struct Tee<B> {
    inner: Pin<Box<B>>,
    kept: Option<BytesMut>,
    limit: usize,
    done: Option<oneshot::Sender<Kept>>,
    /// Ends (is dropped) once the record of what was kept is written, or given up.
    written: Option<oneshot::Receiver<()>>,
    /// The stream's last frame (its trailers) or its end, held back until `written`:
    /// a client that saw the whole response and asks again is answered from the record.
    last: Option<Option<Frame<Bytes>>>,
}

impl<B> Tee<B> {
    fn finish(&mut self, kept: Kept) {
        if let Some(done) = self.done.take() {
            let _ = done.send(kept);
        }
    }
}

impl<B> Drop for Tee<B> {
    fn drop(&mut self) {
        self.finish(Kept::NotKept("the client stopped reading it"));
    }
}

impl<B> Tee<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.last.is_none() {
            match ready!(self.inner.as_mut().poll_frame(cx)) {
                Some(Ok(frame)) => {
                    let frame = to_bytes(frame);
                    if let Some(data) = frame.data_ref() {
                        let fits = self
                            .kept
                            .as_ref()
                            .is_some_and(|kept| kept.len() + data.len() <= self.limit);
                        match &mut self.kept {
                            Some(kept) if fits => kept.extend_from_slice(data),
                            _ => self.kept = None,
                        }
                        return Poll::Ready(Some(Ok(frame)));
                    }
                    // Trailers end the body: the server sends them and reads no more.
                    let trailers = frame.trailers_ref().cloned();
                    self.end(trailers);
                    self.last = Some(Some(frame));
                }
                Some(Err(error)) => {
                    self.finish(Kept::NotKept("it failed while it streamed"));
                    return Poll::Ready(Some(Err(error.into())));
                }
                None => {
                    self.end(None);
                    self.last = Some(None);
                }
            }
        }
        if let Some(written) = &mut self.written {
            // Either way — sent or dropped — the record is written or given up.
            let _ = ready!(Pin::new(written).poll(cx));
            self.written = None;
        }
        Poll::Ready(self.last.as_mut().and_then(Option::take).map(Ok))
    }

    /// Hands over what was kept of the whole stream.
    fn end(&mut self, trailers: Option<HeaderMap>) {
        let kept = match self.kept.take() {
            Some(kept) => Kept::Whole(kept.freeze(), trailers),
            None => Kept::NotKept("it was larger than the layer records"),
        };
        self.finish(kept);
    }
}

impl<B> IdempotencyBody<B> {
    /// Bytes the layer holds.
    pub(crate) fn full(bytes: Bytes) -> Self {
        Self::full_with_trailers(bytes, None)
    }

    /// Bytes the layer holds, then `trailers`.
    pub(crate) fn full_with_trailers(bytes: Bytes, trailers: Option<HeaderMap>) -> Self {
        IdempotencyBody {
            kind: Kind::Full(Some(bytes).filter(|b| !b.is_empty()), trailers),
        }
    }

    /// The inner body, untouched.
    pub(crate) fn passed(body: B) -> Self {
        IdempotencyBody {
            kind: Kind::Passed(Box::pin(body)),
        }
    }

    /// The inner body passed on as it comes, a copy of up to `limit` bytes kept; what
    /// was kept is sent on the receiver when the body ends (or is dropped). The end
    /// itself (its trailers, or the end of the stream) is passed on once `written`
    /// ends: the record of the stream is written before the client sees it whole.
    pub(crate) fn teed(body: B, limit: usize, written: oneshot::Receiver<()>) -> (Self, oneshot::Receiver<Kept>) {
        let (done, kept) = oneshot::channel();
        let tee = Tee {
            inner: Box::pin(body),
            kept: Some(BytesMut::new()),
            limit,
            done: Some(done),
            written: Some(written),
            last: None,
        };
        (IdempotencyBody { kind: Kind::Teed(tee) }, kept)
    }
}

impl<B> From<Bytes> for IdempotencyBody<B> {
    fn from(bytes: Bytes) -> Self {
        IdempotencyBody::full(bytes)
    }
}

impl<B> std::fmt::Debug for IdempotencyBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            Kind::Full(..) => "full",
            Kind::Passed(_) => "passed",
            Kind::Teed(_) => "teed",
        };
        f.debug_struct("IdempotencyBody").field("kind", &kind).finish()
    }
}

/// `frame` with its data as `Bytes`.
fn to_bytes<D: Buf>(frame: Frame<D>) -> Frame<Bytes> {
    frame.map_data(|mut data| data.copy_to_bytes(data.remaining()))
}

impl<B> Body for IdempotencyBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        // Every field is boxed or `Unpin`: the body is `Unpin` whatever `B` is.
        let this = self.get_mut();
        match &mut this.kind {
            Kind::Full(bytes, trailers) => Poll::Ready(
                bytes
                    .take()
                    .map(Frame::data)
                    .or_else(|| trailers.take().map(Frame::trailers))
                    .map(Ok),
            ),
            Kind::Passed(inner) => inner
                .as_mut()
                .poll_frame(cx)
                .map(|frame| frame.map(|frame| frame.map(to_bytes).map_err(Into::into))),
            Kind::Teed(tee) => tee.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full(bytes, trailers) => bytes.is_none() && trailers.is_none(),
            Kind::Passed(inner) => inner.is_end_stream(),
            // Not before its end was seen: the copy is handed over there.
            Kind::Teed(_) => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full(bytes, _) => SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64)),
            Kind::Passed(inner) => inner.size_hint(),
            Kind::Teed(tee) => tee.inner.size_hint(),
        }
    }
}

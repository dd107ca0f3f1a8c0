//! A response body that forwards every frame unchanged and lets a hook watch
//! it (after linkerd2-proxy's `http/body-eos`).
//!
//! The hook sees each data frame as it passes (a cheap `Bytes` clone, no
//! copy) and learns exactly once how the stream ended: complete, with
//! trailers, with an error, cut off by the idle timeout, or cancelled because
//! the client went away (the body was dropped before its end). The bytes flow
//! on regardless of what the hook does, so the forwarding path never waits on
//! scanning.
//!
//! Later stages hang off the same hook: an incremental scanner decodes the
//! frames as they pass, and a blocking-mode hook will hold back a window of
//! the newest bytes (by buffering frames here before yielding them).

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How a body stream ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamEnd {
    /// The upstream finished the body.
    Complete,
    /// The upstream finished the body with trailers.
    Trailers,
    /// The upstream's body failed (connection reset, protocol error).
    Error,
    /// No frame arrived within the idle timeout; residue cut the stream.
    IdleTimeout,
    /// The client went away before the end; the upstream request is dropped
    /// with it, which cancels it.
    Cancelled,
}

impl StreamEnd {
    pub fn as_str(&self) -> &'static str {
        match self {
            StreamEnd::Complete => "complete",
            StreamEnd::Trailers => "trailers",
            StreamEnd::Error => "error",
            StreamEnd::IdleTimeout => "idle_timeout",
            StreamEnd::Cancelled => "cancelled",
        }
    }
}

/// Watches a body. Both methods are called on the forwarding path: they must
/// be cheap and must not block.
pub trait StreamHook: Send + 'static {
    /// Called for every data frame, in order. The frame is *not* the whole body.
    fn on_data(&mut self, data: &Bytes);
    /// Called exactly once, when the stream ends for any reason (including the
    /// body being dropped unfinished).
    fn on_end(self: Box<Self>, end: StreamEnd, trailers: Option<&HeaderMap>);
}

/// The error returned when no frame arrived within the idle timeout.
#[derive(Debug, thiserror::Error)]
#[error("residue: the upstream sent nothing for {0:?}; the response was cut off")]
pub struct IdleTimeout(pub Duration);

pin_project! {
    /// See the module documentation.
    pub struct TapBody<B> {
        #[pin]
        inner: B,
        hook: Option<Box<dyn StreamHook>>,
        idle_timeout: Option<Duration>,
        idle: Option<Pin<Box<Sleep>>>,
        // Whether `idle` measures the current wait. The clock starts when
        // residue starts waiting for the upstream, not when the last frame
        // arrived: a client that reads slowly must not make a healthy
        // upstream look idle.
        armed: bool,
    }

    impl<B> PinnedDrop for TapBody<B> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some(hook) = this.hook.take() {
                hook.on_end(StreamEnd::Cancelled, None);
            }
        }
    }
}

impl<B> TapBody<B> {
    pub fn new(inner: B, hook: Box<dyn StreamHook>, idle_timeout: Option<Duration>) -> Self {
        TapBody {
            inner,
            hook: Some(hook),
            idle_timeout,
            idle: None,
            armed: false,
        }
    }
}

impl<B> Body for TapBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        let polled = this.inner.as_mut().poll_frame(cx);
        let frame = match polled {
            Poll::Pending => {
                if let Some(timeout) = *this.idle_timeout {
                    let deadline = Instant::now() + timeout;
                    let sleep = this
                        .idle
                        .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                    if !*this.armed {
                        sleep.as_mut().reset(deadline);
                        *this.armed = true;
                    }
                    ready!(sleep.as_mut().poll(cx));
                    if let Some(hook) = this.hook.take() {
                        hook.on_end(StreamEnd::IdleTimeout, None);
                    }
                    return Poll::Ready(Some(Err(Box::new(IdleTimeout(timeout)))));
                }
                return Poll::Pending;
            }
            Poll::Ready(frame) => frame,
        };
        // A frame arrived: the next wait starts a fresh clock.
        *this.armed = false;
        match frame {
            Some(Ok(frame)) => {
                if let Some(hook) = this.hook.as_mut() {
                    if let Some(data) = frame.data_ref() {
                        hook.on_data(data);
                    } else if let Some(trailers) = frame.trailers_ref() {
                        if let Some(hook) = this.hook.take() {
                            hook.on_end(StreamEnd::Trailers, Some(trailers));
                        }
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Some(Err(e)) => {
                if let Some(hook) = this.hook.take() {
                    hook.on_end(StreamEnd::Error, None);
                }
                Poll::Ready(Some(Err(e.into())))
            }
            None => {
                if let Some(hook) = this.hook.take() {
                    hook.on_end(StreamEnd::Complete, None);
                }
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        // Never claim the end early: the hook must see `poll_frame` return
        // `None` (or be dropped) to learn how the stream ended.
        false
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full, StreamBody};
    use std::sync::{Arc, Mutex};

    #[derive(Default, Clone)]
    struct Seen(Arc<Mutex<(Vec<u8>, Vec<StreamEnd>)>>);

    impl StreamHook for Seen {
        fn on_data(&mut self, data: &Bytes) {
            self.0.lock().unwrap().0.extend_from_slice(data);
        }
        fn on_end(self: Box<Self>, end: StreamEnd, _: Option<&HeaderMap>) {
            self.0.lock().unwrap().1.push(end);
        }
    }

    #[tokio::test]
    async fn forwards_unchanged_and_reports_completion_once() {
        let seen = Seen::default();
        let body = TapBody::new(
            Full::new(Bytes::from_static(b"hello")),
            Box::new(seen.clone()),
            None,
        );
        let out = body.collect().await.unwrap().to_bytes();
        assert_eq!(&out[..], b"hello");
        let s = seen.0.lock().unwrap();
        assert_eq!(s.0, b"hello");
        assert_eq!(s.1, vec![StreamEnd::Complete]);
    }

    #[tokio::test]
    async fn dropped_early_is_cancelled() {
        let seen = Seen::default();
        let (_tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(1);
        let stream = StreamBody::new(tokio_stream_from(rx));
        let body = TapBody::new(stream, Box::new(seen.clone()), None);
        drop(body);
        assert_eq!(seen.0.lock().unwrap().1, vec![StreamEnd::Cancelled]);
    }

    #[tokio::test(start_paused = true)]
    async fn idle_timeout_cuts_the_stream() {
        let seen = Seen::default();
        let (_tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(1);
        let stream = StreamBody::new(tokio_stream_from(rx));
        let mut body = TapBody::new(stream, Box::new(seen.clone()), Some(Duration::from_secs(5)));
        let err = body.frame().await.unwrap().unwrap_err();
        assert!(err.to_string().contains("sent nothing"));
        drop(body);
        assert_eq!(seen.0.lock().unwrap().1, vec![StreamEnd::IdleTimeout]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_reader_does_not_trip_the_idle_timeout() {
        let seen = Seen::default();
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(4);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            tx.send(Ok(Frame::data(Bytes::from("a")))).await.unwrap();
            tokio::time::sleep(Duration::from_secs(63)).await;
            tx.send(Ok(Frame::data(Bytes::from("c")))).await.unwrap();
        });
        let stream = StreamBody::new(tokio_stream_from(rx));
        let mut body = TapBody::new(stream, Box::new(seen.clone()), Some(Duration::from_secs(5)));
        // Waits 1 s for "a": the idle clock runs during that wait.
        body.frame().await.unwrap().unwrap();
        // The client dawdles far past the idle timeout...
        tokio::time::sleep(Duration::from_secs(60)).await;
        // ...then waits 3 s for "c": within the timeout, measured from now.
        let c = body.frame().await.unwrap().unwrap();
        assert_eq!(c.into_data().unwrap(), Bytes::from("c"));
        assert!(seen.0.lock().unwrap().1.is_empty());
    }

    fn tokio_stream_from<T>(
        mut rx: tokio::sync::mpsc::Receiver<T>,
    ) -> impl futures_util::Stream<Item = T> {
        futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
    }
}

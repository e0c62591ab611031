//! The re-pointing controller: moves each consumer openflux rewrote to
//! where its exports are now, one consumer at a time.

use std::sync::Arc;
use std::time::Duration;

use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio_util::sync::CancellationToken;

use super::{Consumers, Look};
use crate::control::looks::{self, Looks};
use crate::control::{Context, Error, Reconciler, Requeue};

impl Consumers {
    /// Re-points the consumers it is asked to look at until `shutdown`,
    /// one at a time, off the leader's event loop. A failed patch (or a
    /// look that panics) is retried per consumer with backoff; a consumer
    /// changed since it was read (a 409 from the resourceVersion
    /// precondition) is decided again on what it is now.
    pub async fn repoint_all(
        self,
        ctx: Arc<Context>,
        asked: UnboundedReceiver<Look>,
        again: UnboundedSender<Look>,
        shutdown: CancellationToken,
    ) {
        let retry = ctx.retry;
        let repointer = Repointer {
            consumers: self,
            ctx,
        };
        looks::serve(Looks { asked, again }, retry, shutdown, &repointer).await;
    }
}

/// The re-pointing controller: looks at one consumer at a time.
struct Repointer {
    consumers: Consumers,
    ctx: Arc<Context>,
}

impl Reconciler for Repointer {
    type Object = Look;

    async fn reconcile(&self, look: &Look) -> Result<Requeue, Error> {
        self.consumers.look(&self.ctx, look).await?;
        Ok(None)
    }

    fn failed(&self, (consumer, namespace, name): &Look, error: &Error, retry_in: Duration) {
        match error {
            Error::Waiting(why) => tracing::info!(
                consumer = consumer.kind, %namespace, %name, ?retry_in,
                "not re-pointed yet: {why}"
            ),
            error => tracing::warn!(
                consumer = consumer.kind, %namespace, %name, %error, ?retry_in,
                "cannot re-point a consumer; retrying"
            ),
        }
    }
}

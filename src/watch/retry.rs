//! A watch that goes on after an error: [`retrying_with`].

use std::fmt::Debug;
use std::hash::Hash;

use futures::{Stream, StreamExt};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;

use super::backoff::WatchBackoff;
use super::decoded::Rejects;
use super::streaming;

/// [`retrying_with`] whose objects that cannot be decoded are only logged.
pub fn retrying<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    K::DynamicType: Clone + Eq + Hash,
{
    retrying_with(api, config, Rejects::default())
}

/// [`streaming::watcher`]`(api, config, rejects)`, retried after an error
/// with [`WatchBackoff`], which starts again from its first step only once
/// the watch [`works`].
pub fn retrying_with<K>(
    api: Api<K>,
    config: watcher::Config,
    rejects: Rejects,
) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    K::DynamicType: Clone + Eq + Hash,
{
    let backoff = WatchBackoff::default();
    let worked = backoff.clone();
    streaming::watcher(api, config, rejects)
        .backoff(backoff)
        .inspect(move |event| {
            if event.as_ref().is_ok_and(works) {
                worked.worked();
            }
        })
}

/// Whether a watch event proves that the watch works: anything the API
/// server sent. The watcher announces every attempt at a list with an
/// Init, also each retry of a list that keeps failing, so an Init proves
/// nothing.
pub fn works<K>(event: &watcher::Event<K>) -> bool {
    !matches!(event, watcher::Event::Init)
}

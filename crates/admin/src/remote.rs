//! A partitioned topic's admin operations fan out to its partitions, and in a cluster other
//! brokers may own some of them. Such a partition's operation goes to its owner's admin API
//! (Pulsar's broker does the same through its own admin client), with the caller's
//! `Authorization` (kept for the request by [`keep_caller`]), following the owner's redirects.
//! The owner authenticates and authorizes the caller again, so nothing is allowed there that the
//! caller could not do asking it directly.

use std::time::Duration;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, HOST, LOCATION};
use hyper::{Method, StatusCode};
use hyper_util::rt::TokioIo;
use magnetar_model::names::TopicName;
use serde::de::DeserializeOwned;

use crate::hooks::{HookError, TopicOwner};

/// How long an owner may take to answer one operation.
const ANSWER_WITHIN: Duration = Duration::from_secs(60);
/// Redirects followed (the partition moved meanwhile) before the operation fails.
const MAX_REDIRECTS: usize = 3;
/// The largest answer read (a partition's stats with many consumers are tens of KiB).
const MAX_ANSWER: usize = 64 << 20;

tokio::task_local! {
    /// The `Authorization` header of the admin request being served.
    static CALLER: Option<HeaderValue>;
}

/// Middleware: keeps the request's `Authorization` for the operations it sends to owners.
pub(crate) async fn keep_caller(request: Request, next: Next) -> Response {
    let authorization = request.headers().get(AUTHORIZATION).cloned();
    CALLER.scope(authorization, next.run(request)).await
}

/// The broker that owns a partition, as its admin API is reached.
pub(crate) struct RemoteOwner {
    web_url: String,
    /// The broker was chosen to take the partition's free bundle: it is asked with
    /// `authoritative=true`, so that it takes it.
    authoritative: bool,
}

impl RemoteOwner {
    pub(crate) fn of(owner: &TopicOwner) -> RemoteOwner {
        RemoteOwner {
            web_url: owner.web_url.trim_end_matches('/').to_string(),
            authoritative: owner.redirect,
        }
    }

    /// `{method} /admin/v2/{domain}/{tenant}/{namespace}/{topic}{suffix}` at the owner; the
    /// answer's body on success, else the owner's status and reason as a [`HookError`].
    pub(crate) async fn call(
        &self,
        method: Method,
        topic: &TopicName,
        suffix: &str,
        body: Option<serde_json::Value>,
    ) -> Result<Bytes, HookError> {
        let (tenant, namespace) = (topic.tenant(), topic.namespace().namespace());
        let mut url = format!(
            "{}/admin/v2/{}/{tenant}/{namespace}/{}{suffix}",
            self.web_url,
            topic.domain(),
            topic.encoded_local_name()
        );
        if self.authoritative {
            url.push(if suffix.contains('?') { '&' } else { '?' });
            url.push_str("authoritative=true");
        }
        let body = body.map(|b| Bytes::from(b.to_string()));
        let caller = CALLER.try_with(Clone::clone).ok().flatten();
        for _ in 0..=MAX_REDIRECTS {
            let (status, location, answer) =
                tokio::time::timeout(ANSWER_WITHIN, exchange(&url, &method, &caller, &body))
                    .await
                    .map_err(|_| unreachable(&url, "no answer within 60 s"))??;
            match (status, location) {
                (s, _) if s.is_success() => return Ok(answer),
                (StatusCode::TEMPORARY_REDIRECT | StatusCode::PERMANENT_REDIRECT, Some(next)) => {
                    url = next;
                }
                (s, _) => return Err(owner_error(s, &answer)),
            }
        }
        Err(unreachable(&url, "too many redirects"))
    }

    /// [`call`](Self::call), the answer parsed as JSON.
    pub(crate) async fn json<T: DeserializeOwned>(
        &self,
        method: Method,
        topic: &TopicName,
        suffix: &str,
    ) -> Result<T, HookError> {
        let answer = self.call(method, topic, suffix, None).await?;
        serde_json::from_slice(&answer).map_err(|e| {
            HookError::Internal(format!(
                "the owner of {topic} answered what is not understood: {e}"
            ))
        })
    }
}

fn unreachable(url: &str, cause: &str) -> HookError {
    HookError::Unavailable(format!("the topic's owner at {url} did not answer: {cause}"))
}

/// The owner's error as this broker answers it: the same status class and reason.
fn owner_error(status: StatusCode, body: &[u8]) -> HookError {
    let reason = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("reason").and_then(|r| r.as_str()).map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    match status {
        StatusCode::NOT_FOUND => HookError::NotFound(reason),
        StatusCode::CONFLICT => HookError::Conflict(reason),
        StatusCode::PRECONDITION_FAILED => HookError::PreconditionFailed(reason),
        StatusCode::SERVICE_UNAVAILABLE => HookError::Unavailable(reason),
        _ => HookError::Answered(status.as_u16(), reason),
    }
}

/// One request on a connection of its own: (status, redirect location, body).
async fn exchange(
    url: &str,
    method: &Method,
    caller: &Option<HeaderValue>,
    body: &Option<Bytes>,
) -> Result<(StatusCode, Option<String>, Bytes), HookError> {
    let fail = |cause: String| unreachable(url, &cause);
    let Some(rest) = url.strip_prefix("http://") else {
        // TLS between brokers' admin APIs is not there yet: a broker whose plain web port is
        // off cannot be asked.
        return Err(fail("only plain http:// web URLs can be asked".into()));
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let stream =
        tokio::net::TcpStream::connect(authority).await.map_err(|e| fail(e.to_string()))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| fail(e.to_string()))?;
    tokio::spawn(connection);
    let host = HeaderValue::from_str(authority).map_err(|e| fail(e.to_string()))?;
    let mut request = hyper::Request::builder().method(method.clone()).uri(path).header(HOST, host);
    if let Some(authorization) = caller {
        request = request.header(AUTHORIZATION, authorization.clone());
    }
    if body.is_some() {
        request = request.header(CONTENT_TYPE, "application/json");
    }
    let request = request
        .body(Full::new(body.clone().unwrap_or_default()))
        .map_err(|e| fail(e.to_string()))?;
    let response = sender.send_request(request).await.map_err(|e| fail(e.to_string()))?;
    let status = response.status();
    let location =
        response.headers().get(LOCATION).and_then(|l| l.to_str().ok()).map(str::to_string);
    let limited = http_body_util::Limited::new(response.into_body(), MAX_ANSWER);
    let answer = limited.collect().await.map_err(|e| fail(e.to_string()))?.to_bytes();
    Ok((status, location, answer))
}

//! The proxy's HTTP side: the admin API (`/admin/...`) and HTTP lookups (`/lookup/...`) sent on
//! to a broker (round robin), a broker's 307 to a topic's owner followed here (to registered
//! brokers only), so that `pulsar-admin` given the proxy's URL works as against a broker.
//! Headers pass as they are (hop-by-hop ones aside): the broker authenticates the caller's own
//! `Authorization`. As Pulsar's proxy, an HTTP lookup's answer names the owner's own URLs.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderValue, HOST, LOCATION};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};

use crate::directory::host_port;
use crate::{Proxy, ProxyError};

/// The largest request body sent on (Pulsar's proxy: `httpInputMaxReplayBufferSize`, 5 MiB).
const MAX_BODY: usize = 5 << 20;
/// How long a broker may take to answer (Pulsar's proxy: `httpProxyTimeout`, 300 s).
const ANSWER_WITHIN: Duration = Duration::from_secs(300);
/// Redirects followed before the broker's 307 is passed to the caller.
const MAX_REDIRECTS: usize = 3;

/// Headers of one connection, never passed on (RFC 9110 §7.6.1).
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

impl Proxy {
    /// Serves the HTTP side on `listener` until the task is dropped.
    pub async fn serve_http(self: Arc<Self>, listener: TcpListener) {
        loop {
            let (socket, _) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "proxy: HTTP accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let this = self.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| {
                    let this = this.clone();
                    async move { Ok::<_, Infallible>(this.handle(request).await) }
                });
                let served = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(socket), service)
                    .await;
                if let Err(error) = served {
                    tracing::debug!(%error, "proxy: HTTP connection ended");
                }
            });
        }
    }

    async fn handle(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
        let path = request.uri().path_and_query().map_or("/", |p| p.as_str()).to_string();
        if !(path.starts_with("/admin/") || path.starts_with("/lookup/")) {
            return reason(StatusCode::NOT_FOUND, "the proxy serves /admin/ and /lookup/ only");
        }
        let (parts, body) = request.into_parts();
        let body = match Limited::new(body, MAX_BODY).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(_) => {
                let why = "request body larger than 5 MiB, or cut short";
                return reason(StatusCode::PAYLOAD_TOO_LARGE, why);
            }
        };
        match self.forward_http(&parts.method, path, &parts.headers, body).await {
            Ok(response) => response,
            Err(error) => {
                tracing::warn!(%error, "proxy: admin request not answered");
                reason(StatusCode::SERVICE_UNAVAILABLE, &error.to_string())
            }
        }
    }

    async fn forward_http(
        &self,
        method: &Method,
        mut path: String,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Response<Full<Bytes>>, ProxyError> {
        let mut broker = self.brokers.pick().await?.web;
        for _ in 0..MAX_REDIRECTS {
            let response = send(&broker, method, &path, headers, body.clone()).await?;
            if response.status() != StatusCode::TEMPORARY_REDIRECT {
                return Ok(response);
            }
            let Some((to, to_path)) = redirect_target(response.headers()) else {
                return Ok(response);
            };
            if !self.brokers.is_web(&to).await? {
                return Ok(response); // somewhere else: the caller decides
            }
            (broker, path) = (to, to_path);
        }
        send(&broker, method, &path, headers, body).await
    }
}

/// The `host:port` and path of a 307's `Location`.
fn redirect_target(headers: &HeaderMap) -> Option<(String, String)> {
    let location = headers.get(LOCATION)?.to_str().ok()?;
    let rest = location.strip_prefix("http://")?;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let path = if path.is_empty() { "/" } else { path };
    Some((host_port(authority).to_string(), path.to_string()))
}

async fn send(
    broker: &str,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response<Full<Bytes>>, ProxyError> {
    let unreachable =
        |cause: String| ProxyError::BrokerUnreachable { broker: broker.to_string(), cause };
    let exchange = async {
        let stream = TcpStream::connect(broker).await.map_err(|e| unreachable(e.to_string()))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        tokio::spawn(connection);
        let mut request = Request::builder().method(method.clone()).uri(path);
        for (name, value) in headers {
            if name != HOST && !HOP_BY_HOP.contains(&name.as_str()) {
                request = request.header(name, value);
            }
        }
        let host = HeaderValue::from_str(broker).map_err(|e| unreachable(e.to_string()))?;
        let request = request
            .header(HOST, host)
            .body(Full::new(body))
            .map_err(|e| unreachable(e.to_string()))?;
        let response =
            sender.send_request(request).await.map_err(|e| unreachable(e.to_string()))?;
        let (mut parts, body) = response.into_parts();
        let body = body.collect().await.map_err(|e| unreachable(e.to_string()))?.to_bytes();
        for name in HOP_BY_HOP {
            parts.headers.remove(name);
        }
        parts.headers.remove(hyper::header::CONTENT_LENGTH); // set anew for the whole body
        Ok(Response::from_parts(parts, Full::new(body)))
    };
    tokio::time::timeout(ANSWER_WITHIN, exchange)
        .await
        .unwrap_or_else(|_| Err(ProxyError::BrokerTimeout(broker.to_string())))
}

/// An answer of the proxy's own, in the admin API's `{"reason": ...}` shape.
fn reason(status: StatusCode, why: &str) -> Response<Full<Bytes>> {
    let body = serde_json::json!({ "reason": why }).to_string();
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(hyper::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redirect_names_the_broker_and_the_path_to_ask_again() {
        let mut headers = HeaderMap::new();
        let to = "http://127.0.0.1:8081/admin/v2/persistent/public/default/t/stats?x=1";
        headers.insert(LOCATION, HeaderValue::from_static(to));
        let (broker, path) = redirect_target(&headers).unwrap();
        assert_eq!(broker, "127.0.0.1:8081");
        assert_eq!(path, "/admin/v2/persistent/public/default/t/stats?x=1");
        headers.insert(LOCATION, HeaderValue::from_static("https://elsewhere/x"));
        assert_eq!(redirect_target(&headers), None, "only plain http brokers are followed");
    }
}

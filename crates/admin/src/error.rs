//! The admin API's error type and its HTTP rendering.
//!
//! Every handler returns `Result<_, AdminError>`. An error renders as Pulsar's `RestException`
//! does: the status code plus a JSON body `{"reason": "..."}` (Pulsar's `ErrorData`), which the
//! official clients surface as the exception message. Invariant: the status of each variant is
//! fixed by [`AdminError::status`]; server-side failures (5xx) are logged when rendered.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use magnetar_metadata::MetadataError;
use serde::Serialize;
use thiserror::Error;

use crate::hooks::HookError;

/// An admin API failure, with the HTTP status it maps to.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum AdminError {
    /// 400: the request body or a parameter could not be parsed.
    #[error("{0}")]
    BadRequest(String),
    /// 403: the caller's role may not do this (authorization).
    #[error("{0}")]
    Forbidden(String),
    /// 404: the addressed resource does not exist.
    #[error("{0}")]
    NotFound(String),
    /// 405: the operation is disabled (Pulsar's default for forced deletes).
    #[error("{0}")]
    MethodNotAllowed(String),
    /// 406: a value is out of the accepted range (Pulsar uses it for partition counts).
    #[error("{0}")]
    NotAcceptable(String),
    /// 409: the resource already exists, is in the wrong state, or was modified concurrently.
    #[error("{0}")]
    Conflict(String),
    /// 412: a name is invalid or a precondition does not hold.
    #[error("{0}")]
    PreconditionFailed(String),
    /// 422: the request is well-formed but cannot be applied.
    #[error("{0}")]
    Unprocessable(String),
    /// 500: an unexpected failure.
    #[error("{0}")]
    Internal(String),
    /// 503: the metadata store is unavailable (closed or refusing writes).
    #[error("{0}")]
    Unavailable(String),
    /// Any other status (e.g. 413 for an oversized body).
    #[error("{1}")]
    Status(StatusCode, String),
}

impl AdminError {
    /// The HTTP status of this error.
    pub fn status(&self) -> StatusCode {
        match self {
            AdminError::BadRequest(_) => StatusCode::BAD_REQUEST,
            AdminError::Forbidden(_) => StatusCode::FORBIDDEN,
            AdminError::NotFound(_) => StatusCode::NOT_FOUND,
            AdminError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            AdminError::NotAcceptable(_) => StatusCode::NOT_ACCEPTABLE,
            AdminError::Conflict(_) => StatusCode::CONFLICT,
            AdminError::PreconditionFailed(_) => StatusCode::PRECONDITION_FAILED,
            AdminError::Unprocessable(_) => StatusCode::UNPROCESSABLE_ENTITY,
            AdminError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            AdminError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            AdminError::Status(code, _) => *code,
        }
    }
}

impl From<MetadataError> for AdminError {
    fn from(e: MetadataError) -> Self {
        match e {
            MetadataError::BadVersion { .. } => {
                AdminError::Conflict("Concurrent modification".to_string())
            }
            MetadataError::InvalidKey { .. } => {
                AdminError::PreconditionFailed("Name is not valid".to_string())
            }
            MetadataError::ValueTooLarge { .. } => {
                AdminError::Status(StatusCode::PAYLOAD_TOO_LARGE, "Value is too large".to_string())
            }
            MetadataError::Closed | MetadataError::Poisoned { .. } => {
                AdminError::Unavailable(format!("Metadata store unavailable: {e}"))
            }
            other => AdminError::Internal(format!("Metadata store error: {other}")),
        }
    }
}

impl From<HookError> for AdminError {
    fn from(e: HookError) -> Self {
        match e {
            HookError::NotFound(m) => AdminError::NotFound(m),
            HookError::Conflict(m) => AdminError::Conflict(m),
            HookError::PreconditionFailed(m) => AdminError::PreconditionFailed(m),
            HookError::Unavailable(m) => AdminError::Unavailable(m),
            HookError::Internal(m) => AdminError::Internal(m),
            HookError::Answered(status, m) => match StatusCode::from_u16(status) {
                Ok(status) => AdminError::Status(status, m),
                Err(_) => AdminError::Internal(m),
            },
        }
    }
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    reason: &'a str,
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        let status = self.status();
        let reason = self.to_string();
        if status.is_server_error() {
            tracing::warn!(status = status.as_u16(), %reason, "admin request failed");
        }
        (status, Json(ErrorBody { reason: &reason })).into_response()
    }
}

/// Incompatible -> 409 and invalid -> 422, as Pulsar's `SchemasResource`.
impl From<magnetar_model::schema::SchemaError> for AdminError {
    fn from(error: magnetar_model::schema::SchemaError) -> Self {
        match error {
            magnetar_model::schema::SchemaError::Incompatible(why) => AdminError::Conflict(why),
            magnetar_model::schema::SchemaError::Invalid(why) => AdminError::Unprocessable(why),
            magnetar_model::schema::SchemaError::Metadata(why) => AdminError::Internal(why),
        }
    }
}

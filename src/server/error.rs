//! Why the webhook refused a request: status and log line, picked nowhere else at the HTTP edge.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::MAX_BODY_BYTES;
use crate::core::admission::BadReview;

/// A webhook request node-holder does not answer with an AdmissionReview.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("a request body of {length} bytes is over the limit of {MAX_BODY_BYTES}")]
    BodyTooLarge { length: u64 },
    #[error("expected Content-Type application/json, got {content_type:?}")]
    NotJson { content_type: String },
    /// The body is not an `admission.k8s.io/v1` AdmissionReview.
    #[error(transparent)]
    BadReview(#[from] BadReview),
    /// The answer could not be written out (a bug: it is built here).
    #[error("could not serialise the response: {0}")]
    Serialise(serde_json::Error),
}

/// The status, with the reason as the body; logged as a warning (the
/// client's error) or an error (node-holder's): `error` in a word or two,
/// `detail` whole, and what was refused as fields of its own for queries.
impl IntoResponse for WebhookError {
    fn into_response(self) -> Response {
        let (status, error) = match &self {
            WebhookError::BodyTooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "body too large"),
            WebhookError::NotJson { .. } => (StatusCode::UNSUPPORTED_MEDIA_TYPE, "not JSON"),
            WebhookError::BadReview(_) => (StatusCode::BAD_REQUEST, "not an AdmissionReview"),
            WebhookError::Serialise(_) => {
                let error = "serialising the AdmissionReview failed";
                tracing::error!(error, detail = %self, "webhook request failed");
                return (StatusCode::INTERNAL_SERVER_ERROR, format!("{self}\n")).into_response();
            }
        };
        let (content_length, content_type) = match &self {
            WebhookError::BodyTooLarge { length } => (Some(*length), None),
            WebhookError::NotJson { content_type } => (None, Some(content_type.as_str())),
            _ => (None, None),
        };
        tracing::warn!(error, detail = %self, content_length, content_type, "webhook request refused");
        (status, format!("{self}\n")).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_refusal_has_its_status() {
        let malformed = serde_json::from_str::<serde_json::Value>("{").unwrap_err();
        let cases = [
            (
                WebhookError::BodyTooLarge { length: 1 << 30 },
                StatusCode::PAYLOAD_TOO_LARGE,
            ),
            (
                WebhookError::NotJson {
                    content_type: "text/plain".into(),
                },
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ),
            (
                WebhookError::BadReview(BadReview::NoRequest),
                StatusCode::BAD_REQUEST,
            ),
            (
                WebhookError::Serialise(malformed),
                StatusCode::INTERNAL_SERVER_ERROR,
            ),
        ];
        for (error, status) in cases {
            assert_eq!(error.into_response().status(), status);
        }
    }
}

//! Requests the server cannot even decode get Palisade's `invalid_input` code.
//!
//! tonic answers a request body that is not the method's protobuf message
//! (a string field holding invalid UTF-8, a wrong wire type, a message over the
//! size limit) before any handler runs, as a bare INTERNAL or OUT_OF_RANGE
//! status. To a client that looks like a server fault worth retrying; it is bad
//! input that changed nothing. [`mark`] rewrites such answers, on the client
//! listener, to INVALID_ARGUMENT with `palisade-error: invalid_input`.

use http::HeaderValue;

/// gRPC status codes, as they appear in the `grpc-status` header.
const INVALID_ARGUMENT: &str = "3";
const OUT_OF_RANGE: &str = "11";
const INTERNAL: &str = "13";

/// Rewrites a decode failure into Palisade's `invalid_input`; leaves every
/// other response as it is.
pub fn mark<B>(mut response: http::Response<B>) -> http::Response<B> {
    let headers = response.headers();
    let status = headers.get("grpc-status").and_then(|v| v.to_str().ok());
    let message = headers
        .get("grpc-message")
        .and_then(|v| v.to_str().ok())
        .map(|m| m.replace("%20", " "))
        .unwrap_or_default();
    let undecodable = match status {
        Some(INTERNAL) => message.starts_with("failed to decode"),
        Some(OUT_OF_RANGE) => message.contains("message length too large"),
        _ => false,
    };
    if undecodable {
        let headers = response.headers_mut();
        headers.insert("grpc-status", HeaderValue::from_static(INVALID_ARGUMENT));
        headers.insert(
            palisade_proto::ERROR_KEY,
            HeaderValue::from_static(palisade_proto::ErrorCode::InvalidInput.as_str()),
        );
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: &str, message: &str) -> http::Response<()> {
        http::Response::builder()
            .header("grpc-status", status)
            .header("grpc-message", message)
            .body(())
            .unwrap()
    }

    #[test]
    fn decode_failures_become_invalid_input_and_nothing_else_changes() {
        let r = mark(answer(
            INTERNAL,
            "failed%20to%20decode%20Protobuf%20message",
        ));
        assert_eq!(r.headers()["grpc-status"], INVALID_ARGUMENT);
        assert_eq!(r.headers()[palisade_proto::ERROR_KEY], "invalid_input");
        let r = mark(answer(
            OUT_OF_RANGE,
            "Error,%20decoded%20message%20length%20too%20large",
        ));
        assert_eq!(r.headers()["grpc-status"], INVALID_ARGUMENT);
        for (status, message) in [
            (INTERNAL, "storage%20failed"),
            ("14", "failed%20to%20decode"),
        ] {
            let r = mark(answer(status, message));
            assert_eq!(r.headers()["grpc-status"], status);
            assert!(r.headers().get(palisade_proto::ERROR_KEY).is_none());
        }
    }
}

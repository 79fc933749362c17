//! The README's "from Rust" example: take a correctness lock, hand its fencing
//! token to the resource, release it.
//!
//! ```sh
//! palisade dev-cluster &   # or any cluster; PALISADE_ENDPOINTS names it
//! cargo run -p palisade-client --example quickstart
//! ```

use palisade_client::{AcquireOptions, Client, ClientConfig};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), palisade_client::ClientError> {
    let endpoints = std::env::var("PALISADE_ENDPOINTS").unwrap_or_else(|_| "127.0.0.1:7420".into());
    let client = Client::connect(ClientConfig::new(endpoints.split(','))).await?;
    let guard = client
        .acquire("reports/nightly", &AcquireOptions::default())
        .await?;
    // The resource must refuse any write whose token is lower than one it has
    // seen: that is what makes a paused or cut-off holder harmless.
    println!(
        "holding reports/nightly with fencing token {}",
        guard.token()
    );
    println!("guaranteed for another {:?}", guard.remaining());
    guard.release().await?;
    client.close().await
}

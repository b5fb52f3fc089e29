//! Binding the daemon's HTTP ports, before postgres starts, so a taken port fails fast.

/// Binds the API's port and, if configured, the IntegreSQL API's; logs what failed.
pub async fn bind(
    config: &crate::cli::ServeConfig,
) -> Result<(tokio::net::TcpListener, Option<tokio::net::TcpListener>), ()> {
    let bind = |address: std::net::SocketAddr, what: &'static str| async move {
        tokio::net::TcpListener::bind(address)
            .await
            .map_err(|error| {
                tracing::error!(listen = %address, %error, "cannot listen for {what}");
            })
    };
    let main = bind(config.listen, "HTTP").await?;
    let integresql = match config.integresql_listen {
        Some(address) => Some(bind(address, "the IntegreSQL API").await?),
        None => None,
    };
    Ok((main, integresql))
}

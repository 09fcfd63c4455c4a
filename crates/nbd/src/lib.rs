//! cairn's NBD protocol: the wire format ([`proto`]), the server ([`server`]) and a client
//! ([`client`]) used by tests and by remote members.
//!
//! The crate knows nothing of RAID, LUKS or LVM: it serves any [`cairn_block::BlockDevice`].

pub mod client;
pub mod cork;
pub mod fence;
pub mod proto;
pub mod server;
pub mod tls;
pub mod uri;

pub use server::{
    nbd_errno, Added, ConnectionInfo, Export, ExportsHandle, Listen, Listeners, OptionHandler,
    Removed, Server, ServerConfig, ShutdownHandle,
};
pub use tls::{ClientTls, ServerTls, TlsKind};

#![doc = include_str!("../README.md")]

pub mod cli;
pub mod exit;
pub mod healthcheck;
pub mod http;
pub mod listen;
pub mod logs;
pub mod metrics;
pub mod pid_file;
pub mod run;

pub use cli::{Command, HealthcheckConfig, LogFormat, ReloadConfig, ServeArgs, StateDurability};
pub use exit::Exit;
pub use listen::{ListenAddr, Socket};
pub use pid_file::PidFile;
pub use run::{main, Cli, Service, Start};

pub mod client;
pub mod demo;
pub mod stripe_samples;

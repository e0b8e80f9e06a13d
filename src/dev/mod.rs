pub(crate) mod client;
pub(crate) mod demo;
pub(crate) mod send;
pub(crate) mod stripe_samples;

pub mod stripe_billing;

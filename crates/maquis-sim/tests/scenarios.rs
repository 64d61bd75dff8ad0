//! Simulations at 1,000 nodes (200 in debug builds, to stay quick).

use maquis_sim::{run, Fault, Report, Scenario};

fn nodes() -> usize {
    if cfg!(debug_assertions) {
        200
    } else {
        1000
    }
}

fn scenario(name: &str, fault: Fault) -> Scenario {
    let mut s = Scenario::new(name, nodes(), fault);
    s.routed_sends = 500;
    s
}

fn assert_healthy(r: &Report) {
    assert_eq!(r.components, 1, "{r}");
    assert_eq!(r.isolated, 0, "{r}");
    assert!(r.symmetry >= 0.999, "{r}");
}

#[test]
fn stable_overlay_is_connected_symmetric_and_delivers_everything() {
    let r = run(&scenario("stable", Fault::None));
    assert_healthy(&r);
    assert_eq!(r.live, nodes());
    assert_eq!(r.delivery_first, 1.0, "{r}");
    assert_eq!(r.delivery_mean_100, 1.0, "{r}");
    assert_eq!(r.delivery_last, 1.0, "{r}");
    assert!(r.rmr <= 0.1, "{r}");
    assert_eq!(r.healing_periods, Some(0), "{r}");
    assert!(r.routed_delivery.is_some_and(|d| d >= 0.99), "{r}");
}

#[test]
fn half_the_nodes_failing_at_once_loses_almost_nothing() {
    let r = run(&scenario(
        "fail-50%",
        Fault::MassiveFailure { fraction: 0.5 },
    ));
    assert_eq!(r.live, nodes() / 2);
    assert_healthy(&r);
    assert!(r.delivery_mean_100 >= 0.99, "{r}");
    assert!(r.delivery_last >= 0.99, "{r}");
    assert!(r.healing_periods.is_some_and(|h| h <= 3), "{r}");
    assert!(r.routed_delivery.is_some_and(|d| d >= 0.99), "{r}");
}

#[test]
fn churn_keeps_the_overlay_together() {
    let fault = Fault::Churn {
        fraction: 0.02,
        periods: 5,
    };
    let r = run(&scenario("churn", fault));
    assert_healthy(&r);
    assert!(r.delivery_mean_100 >= 0.98, "{r}");
}

#[test]
fn a_healed_partition_merges_again() {
    let r = run(&scenario("partition", Fault::Partition { periods: 3 }));
    assert_healthy(&r);
    assert!(r.healing_periods.is_some(), "{r}");
    assert_eq!(r.delivery_last, 1.0, "{r}");
}

#[test]
fn same_scenario_same_report() {
    let mut s = scenario("det", Fault::MassiveFailure { fraction: 0.3 });
    s.nodes = 100;
    s.broadcasts = 20;
    let strip = |mut r: Report| {
        r.wall_ms = 0;
        r.peak_rss_kb = 0;
        r
    };
    assert_eq!(strip(run(&s)), strip(run(&s)));
    let mut other = s.clone();
    other.seed += 1;
    assert_ne!(strip(run(&s)).messages, strip(run(&other)).messages);
}

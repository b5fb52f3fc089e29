use super::*;

fn names(list: &[&str]) -> Vec<TemplateName> {
    list.iter()
        .map(|name| TemplateName::new(name).expect("a valid name"))
        .collect()
}

fn message(asked: &str, known: &[&str]) -> String {
    LeaseError::UnknownTemplate {
        template: TemplateName::new(asked).expect("a valid name"),
        known: names(known),
    }
    .to_string()
}

#[test]
fn a_misspelt_template_gets_the_nearest_name() {
    let text = message("usres", &["default", "users", "orders"]);
    assert!(text.contains("did you mean \"users\"?"), "{text}");
    let text = message("order", &["default", "users", "orders"]);
    assert!(text.contains("did you mean \"orders\"?"), "{text}");
}

#[test]
fn a_name_far_from_every_template_gets_no_suggestion() {
    let text = message("app", &["default", "users"]);
    assert!(!text.contains("did you mean"), "{text}");
    let text = message("app", &[]);
    assert!(!text.contains("did you mean"), "{text}");
}

use super::*;

#[test]
fn colour_codes_and_line_ends_are_removed_from_a_line() {
    assert_eq!(
        plain_line(b"\x1b[1;31m[ERROR]\x1b[m Failed to execute goal\r\n"),
        "[ERROR] Failed to execute goal"
    );
    assert_eq!(plain_line(b"plain\n"), "plain");
    assert_eq!(plain_line(b"not utf-8: \xff\n"), "not utf-8: \u{fffd}");
}

#[tokio::test]
async fn a_line_without_an_end_is_kept_bounded_and_read_through() {
    let mut input = vec![b'x'; LINE_LIMIT * 3];
    input.extend_from_slice(b"\nnext\n");
    let mut reader = tokio::io::BufReader::with_capacity(1000, input.as_slice());
    let mut line = Vec::new();
    let read = read_line_bounded(&mut reader, &mut line)
        .await
        .expect("read");
    assert_eq!(read, LINE_LIMIT * 3 + 1, "the whole long line is consumed");
    assert_eq!(line.len(), LINE_LIMIT, "but only the limit is kept");
    line.clear();
    read_line_bounded(&mut reader, &mut line)
        .await
        .expect("read");
    assert_eq!(line, b"next\n");
    line.clear();
    let end = read_line_bounded(&mut reader, &mut line)
        .await
        .expect("read");
    assert_eq!(end, 0);
}

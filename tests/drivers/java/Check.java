// Connects with pgjdbc. Two modes:
//
// - A lease (tests/it/drivers.rs), as docs/using-from-tests.md tells Java users to:
//   DriverManager.getConnection(jdbc_url). The jdbc_url and the expected user come as
//   arguments. Prints `ok pgjdbc`.
//   Run: java -cp postgresql.jar Check.java <jdbc_url> <user>
// - The PostgreSQL front (tests/it/front_drivers.rs): PGLEASE_FRONT_URL is
//   `jdbc:postgresql://<host>:<port>/<template>?user=<user>`, given to DriverManager as it
//   is. Two connections, one after the other, check what docs/front.md promises: a clone of
//   its own, the lease's role, a table round trip, a query with a parameter. Prints
//   `ok pgjdbc <first database> <second database>`.
//   Run: PGLEASE_FRONT_URL=jdbc:... java -cp postgresql.jar Check.java
//
// Prints `FAIL pgjdbc: <error>` and exits 1 on failure.
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.Statement;

public class Check {
    public static void main(String[] args) {
        String front = System.getenv("PGLEASE_FRONT_URL");
        try {
            String detail = front == null ? lease(args[0], args[1]) : front(front);
            System.out.println(("ok pgjdbc " + detail).trim());
        } catch (Exception error) {
            System.out.println("FAIL pgjdbc: " + error);
            System.exit(1);
        }
    }

    static String lease(String url, String expected) throws Exception {
        try (Connection conn = DriverManager.getConnection(url);
             ResultSet rows = conn.createStatement().executeQuery("SELECT current_user")) {
            rows.next();
            String user = rows.getString(1);
            if (!user.equals(expected)) {
                throw new IllegalStateException("connected as " + user + ", not " + expected);
            }
            return "";
        }
    }

    static String front(String url) throws Exception {
        String first = probe(url);
        String second = probe(url);
        if (first.equals(second)) {
            throw new IllegalStateException("both connections got " + first);
        }
        return first + " " + second;
    }

    /** The front's checks on a connection of its own; returns its database. */
    static String probe(String url) throws Exception {
        try (Connection conn = DriverManager.getConnection(url);
             Statement statement = conn.createStatement()) {
            String named = conn.getMetaData().getUserName();
            ResultSet who = statement.executeQuery("SELECT current_user, current_database()");
            who.next();
            String user = who.getString(1);
            String database = who.getString(2);
            String template = url.replaceFirst("^jdbc:postgresql://[^/]*/", "").replaceFirst("\\?.*$", "");
            if (database.equals(template)) {
                throw new IllegalStateException("connected to the template's name " + database + ", not a clone");
            }
            // The front logs in as the lease's role, which pglease names after its database;
            // the user the client named is only the front's.
            if (!user.equals(database) || user.equals(named)) {
                throw new IllegalStateException("current_user is " + user + ": not the lease's role of " + database);
            }
            // A fresh clone: the table is not there yet (a reused connection would fail here).
            statement.execute("CREATE TABLE front_check (id int PRIMARY KEY, name text)");
            try (PreparedStatement insert = conn.prepareStatement("INSERT INTO front_check VALUES (?, ?)")) {
                insert.setInt(1, 1);
                insert.setString(2, "one");
                insert.executeUpdate();
            }
            try (PreparedStatement select = conn.prepareStatement("SELECT name FROM front_check WHERE id = ?")) {
                select.setInt(1, 1);
                ResultSet rows = select.executeQuery();
                if (!rows.next() || !rows.getString(1).equals("one")) {
                    throw new IllegalStateException("round trip: no row 'one'");
                }
            }
            // Past pgjdbc's prepareThreshold (5) the statement is a named server-side one.
            try (PreparedStatement add = conn.prepareStatement("SELECT ?::int + 1")) {
                for (int i = 0; i < 7; i++) {
                    add.setInt(1, 41 + i);
                    ResultSet rows = add.executeQuery();
                    if (!rows.next() || rows.getInt(1) != 42 + i) {
                        throw new IllegalStateException("a query with a parameter, round " + i);
                    }
                }
            }
            return database;
        }
    }
}

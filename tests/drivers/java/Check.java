// Connects to a lease with pgjdbc, as docs/using-from-tests.md tells Java users to:
// DriverManager.getConnection(jdbc_url). The jdbc_url and the expected user come as
// arguments. Prints `ok pgjdbc` or `FAIL pgjdbc: <error>`; exits 1 on failure.
// Run: java -cp postgresql.jar Check.java <jdbc_url> <user>
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.ResultSet;

public class Check {
    public static void main(String[] args) {
        try (Connection conn = DriverManager.getConnection(args[0]);
             ResultSet rows = conn.createStatement().executeQuery("SELECT current_user")) {
            rows.next();
            String user = rows.getString(1);
            if (!user.equals(args[1])) {
                throw new IllegalStateException("connected as " + user + ", not " + args[1]);
            }
            System.out.println("ok pgjdbc");
        } catch (Exception error) {
            System.out.println("FAIL pgjdbc: " + error);
            System.exit(1);
        }
    }
}

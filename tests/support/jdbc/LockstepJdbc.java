// The PostgreSQL JDBC driver against `lockstep serve`: what BI tools do first (metadata) and
// what applications do (statements, prepared statements past the driver's server-side prepare
// threshold, a repeatable-read transaction). One line per step: NAME<TAB>OK<TAB>result, or
// NAME<TAB>FAIL<TAB>sqlstate<TAB>message. Usage: java -cp postgresql.jar:. LockstepJdbc PORT TABLE
import java.sql.*;
import java.util.*;

public class LockstepJdbc {
  interface Step { Object run() throws Exception; }

  static void step(String name, Step s) {
    try {
      System.out.println(name + "\tOK\t" + s.run());
    } catch (SQLException e) {
      System.out.println(name + "\tFAIL\t" + e.getSQLState() + "\t" + String.valueOf(e.getMessage()).split("\n")[0]);
    } catch (Exception e) {
      System.out.println(name + "\tFAIL\t-\t" + e);
    }
  }

  static String rows(ResultSet rs) throws SQLException {
    StringBuilder out = new StringBuilder();
    int columns = rs.getMetaData().getColumnCount();
    while (rs.next()) {
      out.append("[");
      for (int i = 1; i <= columns; i++) out.append(rs.getString(i)).append(i < columns ? "," : "");
      out.append("]");
    }
    return out.toString();
  }

  public static void main(String[] args) throws Exception {
    String table = args[1];
    Properties p = new Properties();
    p.setProperty("user", "lockstep");
    try (Connection c = DriverManager.getConnection("jdbc:postgresql://127.0.0.1:" + args[0] + "/lockstep", p)) {
      DatabaseMetaData md = c.getMetaData();
      step("product", () -> md.getDatabaseProductName() + " " + md.getDatabaseProductVersion());
      step("tables", () -> rows(md.getTables(null, "public", "%", new String[] {"TABLE"})));
      step("columns", () -> rows(md.getColumns(null, "public", table, "%")));
      step("schemas", () -> rows(md.getSchemas()));
      step("query", () -> { try (Statement s = c.createStatement(); ResultSet rs = s.executeQuery(
          "SELECT page, views FROM " + table + " ORDER BY page")) { return rows(rs); } });
      step("types", () -> { try (Statement s = c.createStatement(); ResultSet rs = s.executeQuery(
          "SELECT page, views, avg_ms FROM " + table)) { ResultSetMetaData m = rs.getMetaData();
          return m.getColumnTypeName(1) + "," + m.getColumnTypeName(2) + "," + m.getColumnTypeName(3); } });
      step("prepared", () -> { List<String> out = new ArrayList<>();
        try (PreparedStatement ps = c.prepareStatement("SELECT views FROM " + table + " WHERE page = ?")) {
          for (int i = 0; i < 7; i++) { ps.setString(1, "/p1"); try (ResultSet rs = ps.executeQuery()) { out.add(rows(rs)); } }
        }
        return String.join("", new LinkedHashSet<>(out)); });
      step("prepared_long", () -> { try (PreparedStatement ps = c.prepareStatement(
          "SELECT COUNT(*) FROM " + table + " WHERE views >= ?")) { ps.setLong(1, 1L);
          try (ResultSet rs = ps.executeQuery()) { return rows(rs); } } });
      step("unknown_table", () -> { try (Statement s = c.createStatement()) { s.executeQuery("SELECT * FROM nope"); return "read"; } });
      step("write", () -> { try (Statement s = c.createStatement()) { s.executeUpdate("DELETE FROM " + table); return "wrote"; } });
      step("repeatable_read", () -> {
        c.setAutoCommit(false);
        c.setTransactionIsolation(Connection.TRANSACTION_REPEATABLE_READ);
        String first, barrier;
        try (Statement s = c.createStatement()) {
          try (ResultSet rs = s.executeQuery("SELECT SUM(views) FROM " + table)) { first = rows(rs); }
          try (ResultSet rs = s.executeQuery("SHOW lockstep.barrier")) { barrier = rows(rs); }
          Thread.sleep(1500);
          try (ResultSet rs = s.executeQuery("SELECT SUM(views) FROM " + table)) { first += rows(rs); }
          try (ResultSet rs = s.executeQuery("SHOW lockstep.barrier")) { barrier += rows(rs); }
        }
        c.commit();
        c.setAutoCommit(true);
        return first + " " + barrier + " " + c.getTransactionIsolation(); });
    }
  }
}

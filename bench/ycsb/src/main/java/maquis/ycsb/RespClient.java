package maquis.ycsb;

import java.io.FileWriter;
import java.io.IOException;
import java.io.Writer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.Vector;
import java.util.concurrent.atomic.AtomicInteger;

import redis.clients.jedis.Jedis;
import redis.clients.jedis.Pipeline;
import redis.clients.jedis.Response;
import redis.clients.jedis.commands.ProtocolCommand;
import site.ycsb.ByteIterator;
import site.ycsb.DB;
import site.ycsb.DBException;
import site.ycsb.Status;
import site.ycsb.StringByteIterator;

/**
 * A YCSB client over the Redis protocol.
 *
 * <p>Properties:
 *
 * <ul>
 *   <li>{@code resp.hosts}: {@code host:port,host:port,...}; each client thread takes one,
 *       round robin.
 *   <li>{@code resp.timeout.ms}: socket timeout (10,000).
 *   <li>{@code resp.layout}: {@code hash} (a record is a hash: HSET / HGETALL / HMGET / DEL) or
 *       {@code keys} (field {@code f} of record {@code k} is the string key {@code k/f}: MSET /
 *       MGET / DEL, for stores without hashes).
 *   <li>{@code resp.scan}: {@code none} (scans answer NOT_IMPLEMENTED), {@code keysfrom} (the
 *       store's {@code KEYSFROM start count}, then HGETALL of each key, pipelined) or {@code
 *       zset} (for Redis: inserts also add the key to the sorted set {@code resp.index} at score
 *       0, a scan is ZRANGEBYLEX on it, then HGETALL of each key, pipelined).
 *   <li>{@code resp.acklog}: a file to which every key whose insert was acknowledged is
 *       appended, one a line, when the client thread ends.
 * </ul>
 */
public class RespClient extends DB {
  private static final AtomicInteger NEXT = new AtomicInteger();
  private static final Object ACKLOG_LOCK = new Object();
  private static final String INDEX = "resp.index";
  private static final ProtocolCommand KEYSFROM =
      () -> "KEYSFROM".getBytes(StandardCharsets.UTF_8);

  private Jedis jedis;
  private boolean keysLayout;
  private String scan;
  private String[] fieldNames;
  private String acklog;
  private final List<String> acked = new ArrayList<>();

  @Override
  public void init() throws DBException {
    Properties p = getProperties();
    String[] hosts = p.getProperty("resp.hosts", "127.0.0.1:6379").split(",");
    String host = hosts[Math.floorMod(NEXT.getAndIncrement(), hosts.length)].trim();
    int colon = host.lastIndexOf(':');
    int timeout = Integer.parseInt(p.getProperty("resp.timeout.ms", "10000"));
    String layout = p.getProperty("resp.layout", "hash");
    if (!layout.equals("hash") && !layout.equals("keys")) {
      throw new DBException("resp.layout is hash or keys, not " + layout);
    }
    keysLayout = layout.equals("keys");
    scan = p.getProperty("resp.scan", "none");
    if (!scan.equals("none") && !scan.equals("keysfrom") && !scan.equals("zset")) {
      throw new DBException("resp.scan is none, keysfrom or zset, not " + scan);
    }
    if (keysLayout && !scan.equals("none")) {
      throw new DBException("resp.layout=keys keeps no records to scan: use resp.scan=none");
    }
    int fieldCount = Integer.parseInt(p.getProperty("fieldcount", "10"));
    String prefix = p.getProperty("fieldnameprefix", "field");
    fieldNames = new String[fieldCount];
    for (int i = 0; i < fieldCount; i++) {
      fieldNames[i] = prefix + i;
    }
    acklog = p.getProperty("resp.acklog");
    try {
      jedis = new Jedis(host.substring(0, colon), Integer.parseInt(host.substring(colon + 1)), timeout);
      jedis.ping();
    } catch (RuntimeException e) {
      throw new DBException("cannot reach " + host + ": " + e.getMessage(), e);
    }
  }

  @Override
  public void cleanup() throws DBException {
    if (jedis != null) {
      jedis.close();
    }
    if (acklog != null && !acked.isEmpty()) {
      synchronized (ACKLOG_LOCK) {
        try (Writer w = new FileWriter(acklog, StandardCharsets.UTF_8, true)) {
          for (String k : acked) {
            w.write(k);
            w.write('\n');
          }
        } catch (IOException e) {
          throw new DBException("cannot append to " + acklog + ": " + e.getMessage(), e);
        }
      }
    }
  }

  @Override
  public Status read(String table, String key, Set<String> fields, Map<String, ByteIterator> result) {
    try {
      String[] names = fields == null ? fieldNames : fields.toArray(new String[0]);
      if (keysLayout) {
        String[] keys = new String[names.length];
        for (int i = 0; i < names.length; i++) {
          keys[i] = key + "/" + names[i];
        }
        put(result, names, jedis.mget(keys));
      } else if (fields == null) {
        StringByteIterator.putAllAsByteIterators(result, jedis.hgetAll(key));
      } else {
        put(result, names, jedis.hmget(key, names));
      }
      return result.isEmpty() ? Status.NOT_FOUND : Status.OK;
    } catch (RuntimeException e) {
      return Status.ERROR;
    }
  }

  private static void put(Map<String, ByteIterator> result, String[] names, List<String> values) {
    for (int i = 0; i < names.length; i++) {
      if (values.get(i) != null) {
        result.put(names[i], new StringByteIterator(values.get(i)));
      }
    }
  }

  @Override
  public Status scan(String table, String startkey, int recordcount, Set<String> fields,
      Vector<HashMap<String, ByteIterator>> result) {
    try {
      List<String> keys;
      if (scan.equals("keysfrom")) {
        keys = new ArrayList<>();
        Object reply = jedis.sendCommand(KEYSFROM, startkey, Integer.toString(recordcount));
        for (Object k : (List<?>) reply) {
          keys.add(new String((byte[]) k, StandardCharsets.UTF_8));
        }
      } else if (scan.equals("zset")) {
        keys = jedis.zrangeByLex(INDEX, "[" + startkey, "+", 0, recordcount);
      } else {
        return Status.NOT_IMPLEMENTED;
      }
      Pipeline pipe = jedis.pipelined();
      List<Response<Map<String, String>>> records = new ArrayList<>(keys.size());
      for (String k : keys) {
        records.add(pipe.hgetAll(k));
      }
      pipe.sync();
      for (Response<Map<String, String>> r : records) {
        HashMap<String, ByteIterator> row = new HashMap<>();
        StringByteIterator.putAllAsByteIterators(row, r.get());
        if (fields != null) {
          row.keySet().retainAll(fields);
        }
        result.add(row);
      }
      return Status.OK;
    } catch (RuntimeException e) {
      return Status.ERROR;
    }
  }

  @Override
  public Status update(String table, String key, Map<String, ByteIterator> values) {
    return write(key, values, false);
  }

  @Override
  public Status insert(String table, String key, Map<String, ByteIterator> values) {
    Status s = write(key, values, true);
    if (s.isOk() && acklog != null) {
      acked.add(key);
    }
    return s;
  }

  private Status write(String key, Map<String, ByteIterator> values, boolean insert) {
    try {
      Map<String, String> fields = StringByteIterator.getStringMap(values);
      if (keysLayout) {
        String[] kv = new String[fields.size() * 2];
        int i = 0;
        for (Map.Entry<String, String> e : fields.entrySet()) {
          kv[i++] = key + "/" + e.getKey();
          kv[i++] = e.getValue();
        }
        jedis.mset(kv);
      } else {
        jedis.hset(key, fields);
        if (insert && scan.equals("zset")) {
          jedis.zadd(INDEX, 0, key);
        }
      }
      return Status.OK;
    } catch (RuntimeException e) {
      return Status.ERROR;
    }
  }

  @Override
  public Status delete(String table, String key) {
    try {
      long n;
      if (keysLayout) {
        String[] keys = new String[fieldNames.length];
        for (int i = 0; i < fieldNames.length; i++) {
          keys[i] = key + "/" + fieldNames[i];
        }
        n = jedis.del(keys);
      } else {
        n = jedis.del(key);
        if (scan.equals("zset")) {
          jedis.zrem(INDEX, key);
        }
      }
      return n > 0 ? Status.OK : Status.NOT_FOUND;
    } catch (RuntimeException e) {
      return Status.ERROR;
    }
  }
}

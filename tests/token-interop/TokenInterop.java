// Tokens and keys as Apache Pulsar makes and checks them (its AuthTokenUtils and
// AuthenticationProviderToken, on jjwt 0.11): secret keys are raw bytes (SecretKeySpec),
// key pairs are PKCS#8 / X.509 DER (Java's getEncoded()), tokens are signed with
// Jwts.builder().signWith(key) and checked with a parser holding the validation key.
// Run with `java -cp <jjwt classpath> TokenInterop.java <command> ...` (tests/compat/test_auth_interop.py).

import io.jsonwebtoken.Claims;
import io.jsonwebtoken.Jws;
import io.jsonwebtoken.Jwts;
import io.jsonwebtoken.security.Keys;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.security.Key;
import java.security.KeyFactory;
import java.security.KeyPair;
import java.security.KeyPairGenerator;
import java.security.spec.PKCS8EncodedKeySpec;
import java.security.spec.X509EncodedKeySpec;
import java.util.Date;

public class TokenInterop {
    static byte[] read(String path) throws Exception {
        return Files.readAllBytes(Paths.get(path));
    }

    static Key key(String kind, String path, String family) throws Exception {
        byte[] bytes = read(path);
        switch (kind) {
            case "secret":
                return Keys.hmacShaKeyFor(bytes);
            case "private":
                return KeyFactory.getInstance(family).generatePrivate(new PKCS8EncodedKeySpec(bytes));
            case "public":
                return KeyFactory.getInstance(family).generatePublic(new X509EncodedKeySpec(bytes));
            default:
                throw new IllegalArgumentException("kind " + kind);
        }
    }

    public static void main(String[] args) throws Exception {
        switch (args[0]) {
            case "create-secret-key": {
                // TokensCliUtils: Keys.secretKeyFor(HS256).getEncoded(), raw bytes
                Files.write(Paths.get(args[1]), Keys.secretKeyFor(io.jsonwebtoken.SignatureAlgorithm.HS256).getEncoded());
                break;
            }
            case "create-key-pair": {
                // TokensCliUtils: Keys.keyPairFor(RS256), private and public getEncoded()
                KeyPair pair = Keys.keyPairFor(io.jsonwebtoken.SignatureAlgorithm.valueOf(args[3]));
                Files.write(Paths.get(args[1]), pair.getPrivate().getEncoded());
                Files.write(Paths.get(args[2]), pair.getPublic().getEncoded());
                break;
            }
            case "create": {
                // create <secret|private> <key file> <RSA|EC> <subject> [expiry seconds]
                var builder = Jwts.builder().setSubject(args[4]).signWith(key(args[1], args[2], args[3]));
                if (args.length > 5) {
                    builder.setExpiration(new Date(System.currentTimeMillis() + Long.parseLong(args[5]) * 1000));
                }
                System.out.println(builder.compact());
                break;
            }
            case "validate": {
                // validate <secret|public> <key file> <RSA|EC> <token>: prints the subject
                Jws<Claims> jws = Jwts.parserBuilder().setSigningKey(key(args[1], args[2], args[3]))
                        .build().parseClaimsJws(args[4]);
                System.out.println(jws.getBody().getSubject());
                break;
            }
            default:
                throw new IllegalArgumentException("command " + args[0]);
        }
    }
}
